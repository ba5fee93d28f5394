"""A GEMM chain computing its operands' elementwise prologue: Llama's rotary embedding on q and k
before grouped-query attention (`candidates.compute_prologue` inside a subgraph,
`orchestrate/post_fusion.py` across the partition's cuts), in Triton's interpreter on the CPU."""
from __future__ import annotations

import numpy as np
import pytest
from kernelcheck import DEVICE
from onnx import helper
from opcheck import Const, graph_model, rand
from test_chain import check_chain, whole_kernel
from test_gemm_template import run_exe

import tessera
from tessera.codegen.select import TritonLegality
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.orchestrate import build_ograph
from tessera.orchestrate.candidates import CandidateRules, enumerate_candidates
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import run_onnxruntime


def rotary_attention(m: int, heads: int, kv_heads: int, d: int, seed: int = 0, q_out: bool = False,
                     blocks: int = 1):
    """Causal attention of rotated q and k as exported Llama-family models spell it: x * cos +
    rotate_half(x) * sin, rotate_half(x) = concat(-x[..., d/2:], x[..., :d/2]); k and v repeated
    from `kv_heads` to `heads` (Unsqueeze, Expand, Reshape). `q_out`: the rotated q is an output too.
    `blocks` > 1: that many such attentions side by side, on inputs of their own, their results summed."""
    h = d // 2
    inv = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    freqs = np.outer(np.arange(m), inv)
    emb = np.concatenate([freqs, freqs], axis=-1)
    keep = np.tril(np.ones((m, m), bool))
    inits: dict = {"cos": Const(np.cos(emb).astype(np.float32)),
                   "sin": Const(np.sin(emb).astype(np.float32)), "axis3": Const(np.array([3], np.int64)),
                   "lo": Const(np.array([0], np.int64)), "mid": Const(np.array([h], np.int64)),
                   "hi": Const(np.array([d], np.int64)), "axis2": Const(np.array([2], np.int64)),
                   "rep": Const(np.array([1, kv_heads, heads // kv_heads, m, 1], np.int64)),
                   "all_heads": Const(np.array([1, heads, m, d], np.int64)),
                   "scale": Const(np.array(1 / np.sqrt(d), np.float32)), "keep": Const(keep),
                   "ninf": Const(np.array(-np.inf, np.float32))}
    nodes, feeds, outs = [], {}, []
    for b in range(blocks):
        pre = f"b{b}_" if blocks > 1 else ""

        def t(name: str) -> str:
            return pre + name

        for i, (x, n) in enumerate((("q", heads), ("k", kv_heads), ("v", kv_heads))):
            feeds[t(x)] = rand(1, n, m, d, seed=seed + 3 * b + i)
        for x in "qk":
            nodes += [helper.make_node("Slice", [t(x), "lo", "mid", "axis3"], [t(f"{x}1")]),
                      helper.make_node("Slice", [t(x), "mid", "hi", "axis3"], [t(f"{x}2")]),
                      helper.make_node("Neg", [t(f"{x}2")], [t(f"{x}n")]),
                      helper.make_node("Concat", [t(f"{x}n"), t(f"{x}1")], [t(f"{x}h")], axis=3),
                      helper.make_node("Mul", [t(x), "cos"], [t(f"{x}c")]),
                      helper.make_node("Mul", [t(f"{x}h"), "sin"], [t(f"{x}s")]),
                      helper.make_node("Add", [t(f"{x}c"), t(f"{x}s")], [t(f"{x}r")])]
        for x, src in (("k", "kr"), ("v", "v")):
            nodes += [helper.make_node("Unsqueeze", [t(src), "axis2"], [t(f"{x}5")]),
                      helper.make_node("Expand", [t(f"{x}5"), "rep"], [t(f"{x}e")]),
                      helper.make_node("Reshape", [t(f"{x}e"), "all_heads"], [t(f"{x}_all")])]
        nodes += [helper.make_node("Transpose", [t("k_all")], [t("kt")], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", [t("qr"), t("kt")], [t("s")]),
                  helper.make_node("Mul", [t("s"), "scale"], [t("ss")]),
                  helper.make_node("Where", ["keep", t("ss"), "ninf"], [t("sm")]),
                  helper.make_node("Softmax", [t("sm")], [t("p")], axis=-1),
                  helper.make_node("MatMul", [t("p"), t("v_all")], [t("out")])]
        outs.append(t("out"))
    if blocks > 1:
        nodes.append(helper.make_node("Sum", outs, ["out"]))
    model = graph_model(nodes, {**feeds, **inits}, ["out", "qr"] if q_out else ["out"])
    return model, feeds


@pytest.mark.parametrize("m,d", [(13, 64), (7, 80)])
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_the_chain_rotates_q_and_k_where_it_loads_them(m, d, precision):
    """The whole graph as one chain kernel: q's rotation in the first product's left operand, k's in
    its right operand (read transposed, through the repeat to four heads), against float64."""
    model, feeds = rotary_attention(m, 4, 2, d, seed=3)
    ks = check_chain(model, feeds, precision=precision)
    g, _, _, _ = whole_kernel(model, precision)
    assert sorted(t for t in ks.inputs if t not in g.constants) == ["k", "q", "v"]  # nothing rotated is stored


def test_the_grown_chain_takes_in_the_rotations_read_nowhere_else():
    model, _ = rotary_attention(13, 4, 2, 64)
    g, _, _, _ = whole_kernel(model)
    og = build_ograph(g)
    found = {c.nodes for c in enumerate_candidates(og, og.all, CandidateRules(max_linear=2),
                                                   TritonLegality(chains=True))}
    assert og.all in found  # 2 rotations, the repeat, the chain: more than the size rule and its growth alone
    rotations = sum(1 << i for i, n in enumerate(og.nodes) if n.op in ("neg", "concat"))
    assert rotations.bit_count() == 4 and all(m & rotations != rotations for m in found if m != og.all
                                               and m.bit_count() <= 16)


def _run(result, model, feeds, tmp_path) -> float:
    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", DEVICE)
    ref = run_onnxruntime(model, feeds)
    return max(rel_l2(got, ref[name]) for got, name in zip(run_exe(exe, feeds), exe.output_names))


@pytest.mark.parametrize("max_states", [2000, 30])
def test_rotary_attention_compiles_to_one_kernel_across_a_cut(max_states, tmp_path):
    """Within one subgraph the solver picks the chain grown by its rotations; where the partition
    cuts between them (30 states), the solved plan's rotation kernels join the chain afterwards,
    priced cheaper than apart."""
    model, feeds = rotary_attention(13, 4, 2, 64, seed=5)
    result = compile_model(model, CompileOptions(cost="analytical", templates="force", max_states=max_states))
    runs = [k for k in result.kernels if k.backend != "view"]
    assert len(runs) == 1 and "GEMM-chain template" in runs[0].triton.source
    plan = result.plan
    if max_states == 30:
        lost = {tuple(e) for c in plan.cuts for e in c["lost_fusions"]}
        assert plan.cuts and any("MatMul" in consumer for _, consumer in lost)
        assert plan.absorbed and all(a["after_us"] < a["before_us"] for a in plan.absorbed)
    else:
        assert not plan.cuts and not plan.absorbed
    assert _run(result, model, feeds, tmp_path) < TOLERANCE["fp32"]
    report = (tmp_path / "art" / "report.html").read_text()
    assert ("joined us" in report) == bool(plan.absorbed)  # the report lists each fusion


def test_a_rotation_read_elsewhere_stays_its_own_kernel(tmp_path):
    """The rotated q is an output of the model too: the kernel writing it stays, and the chain reads it."""
    model, feeds = rotary_attention(13, 4, 2, 64, seed=7, q_out=True)
    result = compile_model(model, CompileOptions(cost="analytical", templates="force", max_states=30))
    qr = result.graph.outputs[1]
    (writer,) = [k for k in result.plan.kernels if qr in k.outputs]
    assert any(p.endswith("/neg") for p in writer.prims) and not any(p.endswith("/matmul") for p in writer.prims)
    assert _run(result, model, feeds, tmp_path) < TOLERANCE["fp32"]


class _Recording:
    """An analytical cost that records its batches, and prices an unknown candidate in a batch of
    its own when asked for it (as a measured cost does)."""

    def __init__(self, base) -> None:
        self.base, self.known, self.batches = base, set(), []

    def prepare(self, cands) -> None:
        self.batches.append(len(cands))
        self.known |= {(c.nodes, c.outputs) for c in cands}

    def __call__(self, c) -> float:
        if (c.nodes, c.outputs) not in self.known:
            self.prepare([c])
        return self.base(c)


def test_the_fusions_after_the_solve_are_priced_a_round_at_a_time():
    """Two attention blocks side by side, each cut from its rotations: the fusions of both blocks are
    priced together, a round per step along the rotations (a measured compile times each round as one
    batch), not one candidate at a time."""
    from tessera.cost.analytical import AnalyticalCost
    from tessera.cost.devices import DEVICES
    from tessera.orchestrate.orchestrator import orchestrate

    model, _ = rotary_attention(13, 4, 2, 64, seed=9, blocks=2)
    g = whole_kernel(model)[0]
    og = build_ograph(g)
    cost = _Recording(AnalyticalCost(og, DEVICES["h100"], "fp32"))
    plan = orchestrate(og, cost, rules=CandidateRules(max_linear=2), legality=TritonLegality(chains=True),
                       max_states=30)
    rounds = len(cost.batches) - 1  # the first batch is every subgraph's candidates
    chains = [k for k in plan.kernels if sum(p.endswith("/matmul") for p in k.prims) == 2]
    assert len(chains) == 2 and all(any(p.endswith("/neg") for p in k.prims) for k in chains)
    assert plan.absorbed and 0 < rounds < len(plan.absorbed), (rounds, cost.batches, len(plan.absorbed))
