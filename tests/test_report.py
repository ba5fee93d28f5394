"""The HTML plan report: well-formed, self-contained, one SVG box per node, stripes for redundancy."""
from __future__ import annotations

import copy
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tessera.compiler import CompileOptions, CompileResult, compile_model, write_artifacts
from tessera.orchestrate.report import write_report

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Counter(HTMLParser):
    """Counts tags, checks that every element is closed in order, and counts stripes per SVG node."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.nodes: list[str] = []  # data-node values, in document order
        self.stripes: dict[str, int] = {}
        self.node_stack: list[str | None] = []  # the data-node of each open <g>

    def _count(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] = self.tags.get(tag, 0) + 1
        a = dict(attrs)
        if "data-node" in a:
            self.nodes.append(a["data-node"] or "")
        current = next((n for n in reversed(self.node_stack) if n), None)
        if tag == "rect" and a.get("class") == "stripe" and current is not None:
            self.stripes[current] = self.stripes.get(current, 0) + 1

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count(tag, attrs)
        if tag in VOID:
            return
        self.stack.append(tag)
        if tag == "g":
            self.node_stack.append(dict(attrs).get("data-node"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._count(tag, attrs)  # <rect .../>: no end tag follows

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()
        if tag == "g":
            self.node_stack.pop()


def parse(path: Path) -> tuple[Counter, str]:
    text = path.read_text(encoding="utf-8")
    p = Counter()
    p.feed(text)
    p.close()
    return p, text


@pytest.fixture(scope="module", params=["attn_s7.onnx", "bert_tiny.onnx"])
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[CompileResult, Path]:
    result = compile_model(MODELS / request.param, CompileOptions(cost="analytical"))
    out = tmp_path_factory.mktemp(request.param.replace(".onnx", ""))
    write_artifacts(result, out)
    return result, out


def test_report_is_well_formed_and_self_contained(compiled: tuple[CompileResult, Path]) -> None:
    _, out = compiled
    assert (out / "plan.json").exists()
    p, text = parse(out / "report.html")
    assert not p.errors, p.errors[:5]
    assert not p.stack, f"unclosed: {p.stack}"
    assert p.tags.get("svg") == 1 and p.tags.get("table", 0) >= 3
    # No network or external files: nothing is loaded by URL.
    assert "<link" not in text and "src=" not in text and "@import" not in text and "url(" not in text


def test_report_lists_every_kernel_and_summary(compiled: tuple[CompileResult, Path]) -> None:
    result, out = compiled
    plan = result.plan
    _, text = parse(out / "report.html")
    for k in plan.kernels:
        assert escape(k.name) in text
    for word in (plan.device, plan.strategy, plan.precision, plan.cost_model, "greedy baseline total"):
        assert escape(word) in text


def test_one_svg_box_per_orchestrated_node(compiled: tuple[CompileResult, Path]) -> None:
    result, out = compiled
    p, _ = parse(out / "report.html")
    og = result.ograph
    assert len(p.nodes) == og.n
    assert sorted(p.nodes) == sorted(n.name for n in og.nodes)
    in_kernels = {name for k in result.plan.kernels for name in k.prims}
    for name in p.nodes:  # every node computed by a kernel has at least one stripe
        assert p.stripes.get(name, 0) == sum(name in k.prims for k in result.plan.kernels)
        assert name in in_kernels


def test_redundant_node_gets_one_stripe_per_kernel(compiled: tuple[CompileResult, Path], tmp_path: Path) -> None:
    result, _ = compiled
    plan = copy.deepcopy(result.plan)
    assert len(plan.kernels) >= 2
    shared = plan.kernels[0].prims[0]
    plan.kernels[1].prims.append(shared)
    plan.kernels[1].name = "k1_<weird & name>"
    plan.cuts = [{"position": 1, "tensors": ["t<x>"], "bytes": 4096, "lost_fusions": [["prod_a", "cons_b"]]}]
    write_report(plan, result.ograph, tmp_path / "r.html")
    p, text = parse(tmp_path / "r.html")
    assert not p.errors and not p.stack
    assert p.stripes[shared] == 1 + sum(shared in k.prims for k in result.plan.kernels) > 1
    assert escape("k1_<weird & name>") in text and "<weird" not in text
    assert "t&lt;x&gt;" in text and "prod_a → cons_b" in text and "4,096" in text
