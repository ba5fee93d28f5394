"""The artifact directory `tessera compile -o OUT` writes and `tessera.load` reads.

    OUT/plan.json      the plan (kernels, order, buffers, solver statistics)
    OUT/report.html    the plan for a person
    OUT/kernels/*.py   the generated Triton source, to read
    OUT/model.onnx     the source model: the weights (stored once) and the reference for --check
    OUT/artifact.json  format, tessera version, precision, input shapes, the layout choice,
                       a digest of the primitive graph, and a SHA-256 of every other file

Nothing in an artifact can run code when loaded: there is no pickle. Loading re-runs the
deterministic passes from model.onnx (frontend, fission, precision, the layout choice replayed)
to rebuild the primitive graph, checks it against the digest, and builds the executable from
plan.json; it re-plans and re-measures nothing. An edited or truncated file, or an artifact
another tessera built, is refused with the reason, never run.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import onnx
import torch

from tessera.codegen.chain import known_fault
from tessera.errors import ModelLoadError, TesseraError
from tessera.fission import fission
from tessera.frontend import LoadedModel, load as frontend_load
from tessera.ir.graph import Graph
from tessera.log import logger
from tessera.orchestrate.layout import assign_layouts
from tessera.rewrite import convert_precision, mark_tf32_operands
from tessera.rewrite.bias_after import BIAS_AFTER, move_bias_after_matmul
from tessera.rewrite.deferred import DEFERRED, defer_normalization
from tessera.rewrite.search import replay
from tessera.runtime.executable import Executable
from tessera.version import __version__

FORMAT = 2  # 2: no pickle; the graph is rebuilt from model.onnx (1 held graph.pkl)


def graph_digest(graph: Graph) -> str:
    """SHA-256 of everything that defines a primitive graph: nodes, types (with layouts), constants."""
    h = hashlib.sha256()
    h.update(json.dumps([graph.inputs, graph.outputs, sorted(graph.opsets.items())]).encode())
    for n in graph.nodes:
        h.update(f"{n.name}|{n.op}|{n.inputs}|{n.outputs}|{sorted((k, repr(v)) for k, v in n.attrs.items())}".encode())
    for t in sorted(graph.types):
        h.update(f"{t}:{graph.types[t]}".encode())
    if graph.tf32_rounded:  # absent from graphs without it, whose digests stay as they were
        h.update(json.dumps(sorted(graph.tf32_rounded)).encode())
    for t in sorted(graph.constants):
        v = graph.constants[t]
        h.update(f"{t}:{v.dtype}:{v.shape}".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def _artifact_files(out: Path) -> list[Path]:
    """The files a compile writes (other files in the folder are the user's business)."""
    return [f for f in [out / "plan.json", out / "report.html", out / "model.onnx",
                        *sorted((out / "kernels").glob("*.py"))] if f.is_file()]


def _file_hashes(out: Path) -> dict[str, str]:
    return {str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest() for f in _artifact_files(out)}


def rebuild_graph(model: Path | bytes | LoadedModel, meta: dict[str, Any]) -> Graph:
    """The primitive graph a compile ran, from its source model (a path, its bytes, or the model
    already loaded) and the choices it recorded."""
    shapes = {k: tuple(v) for k, v in meta["input_shapes"].items()}
    loaded = model if isinstance(model, LoadedModel) else frontend_load(model, shapes)
    if loaded.input_shapes != shapes:
        raise ModelLoadError(f"the model takes inputs shaped {loaded.input_shapes}; the plan was made for {shapes}")
    graph = fission(loaded.graph).graph
    for rule in meta.get("rewrites", []):
        if isinstance(rule, dict):  # a step the rewrite search kept
            try:
                graph = replay(graph, [rule])
            except (KeyError, ValueError) as e:
                raise ModelLoadError(f"the artifact's rewrites do not replay on its model: {e.args[0]}") from None
        elif rule == DEFERRED:
            graph = defer_normalization(graph)[0]
        elif rule == BIAS_AFTER:
            graph = move_bias_after_matmul(graph)[0]
        else:
            raise ModelLoadError(f"the artifact was compiled with the rewrite {rule!r}, which this tessera lacks")
    graph = convert_precision(graph, meta["precision"], meta.get("io", "model"))
    graph = assign_layouts(graph, None, "nchw", replay=list(meta["layout_choices"]),
                           unpadded=list(meta.get("layout_unpadded", []))).graph
    return mark_tf32_operands(graph, meta["precision"])


def save_artifact(out: Path, graph: Graph, model: onnx.ModelProto, meta: dict[str, Any],
                  layout_choices: list[bool]) -> None:
    """Write model.onnx and artifact.json beside what the caller wrote (plan.json, report, kernels)."""
    out.mkdir(parents=True, exist_ok=True)
    stale = out / "graph.pkl"  # format 1's pickle, from an older compile into this folder
    if stale.exists():
        stale.unlink()
    (out / "buckets.json").unlink(missing_ok=True)  # an earlier compile with shape buckets here
    onnx.save(model, str(out / "model.onnx"))
    doc = {"format": FORMAT, **meta, "layout_choices": layout_choices, "graph_digest": graph_digest(graph),
           "files": _file_hashes(out)}
    doc["seal"] = _seal(doc)
    (out / "artifact.json").write_text(json.dumps(doc, indent=1))


def _seal(doc: dict[str, Any]) -> str:
    """A hash of artifact.json's own fields, so an edit to it is caught like an edit to any file."""
    return hashlib.sha256(json.dumps({k: v for k, v in doc.items() if k != "seal"}, sort_keys=True).encode()).hexdigest()


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / "artifact.json"
    if not meta_path.is_file() and (Path(path) / "buckets.json").is_file():
        raise ModelLoadError(f"{path} holds one artifact per shape bucket (buckets.json); `tessera run` and "
                             f"tessera.load take it whole, other commands one of its bucket_* folders")
    if not meta_path.is_file():
        raise ModelLoadError(f"{path}: not a tessera artifact (no artifact.json); make one with tessera compile -o")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: artifact.json is damaged ({e}); compile the model again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ModelLoadError(f"{path}: artifact format {got} is not {FORMAT} (an older tessera wrote it); "
                             "compile it again")
    if meta.get("seal") != _seal(meta):
        raise ModelLoadError(f"{path}: artifact.json was changed after the compile wrote it; compile it again")
    need = ("precision", "input_shapes", "layout_choices", "graph_digest", "files")
    if any(k not in meta for k in need):
        raise ModelLoadError(f"{path}: artifact.json lacks {[k for k in need if k not in meta]}; compile it again")
    return meta


def verify_files(path: Path, meta: dict[str, Any]) -> dict[str, bytes]:
    """Every file the compile wrote is there and unedited; returns their contents, read once."""
    if not isinstance(meta["files"], dict) or "plan.json" not in meta["files"] or "model.onnx" not in meta["files"]:
        raise ModelLoadError(f"{path}: artifact.json lists no files; the artifact is damaged, compile it again")
    contents = {}
    for name, digest in meta["files"].items():
        f = path / name
        if not f.is_file():
            raise ModelLoadError(f"{path}: {name} is missing; the artifact is damaged, compile it again")
        contents[name] = f.read_bytes()
        if hashlib.sha256(contents[name]).hexdigest() != digest:
            raise ModelLoadError(f"{path}: {name} was changed after the compile wrote it; the artifact is "
                                 "damaged, compile it again")
    return contents


def load_artifact(path: str | Path, device: str | torch.device = "cpu") -> Executable:
    """The executable saved in `path`, on `device`."""
    path = Path(path)
    meta = read_meta(path)
    files = verify_files(path, meta)
    try:
        plan = json.loads(files["plan.json"])
        graph = rebuild_graph(files["model.onnx"], meta)
    except (OSError, ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError too
        raise ModelLoadError(f"{path}: the artifact is damaged ({e}); compile it again") from None
    except TesseraError as e:
        raise ModelLoadError(f"{path}: model.onnx no longer compiles as it did ({e}); compile it again") from None
    if graph_digest(graph) != meta["graph_digest"]:
        raise ModelLoadError(f"{path}: this tessera ({__version__}) rebuilds another graph than the one tessera "
                             f"{meta.get('tessera')} planned; compile the model again")
    _check_plan(path, graph, plan)
    faulty = faulting_chains(plan)
    if faulty:  # a plan saved before session 62 excluded these tiles: it runs, but may fault on Hopper
        logger.warning("%s: kernels %s are GEMM chains at tiles that Triton compiles into kernels that fault "
                       "now and then on Hopper GPUs (32-column blocks, 64 rows a warp group); compile the model "
                       "again to have them tuned without those tiles", path, ", ".join(faulty))
    try:
        return Executable(graph, plan, device)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ModelLoadError(f"{path}: plan.json does not match the saved graph ({type(e).__name__}: {e}); "
                             "the artifact is damaged, compile it again") from None


def faulting_chains(plan: dict[str, Any]) -> list[str]:
    """The plan's chain kernels whose tile Triton is known to miscompile (`codegen/chain.known_fault`)."""
    out = []
    for k in plan["kernels"]:
        s = k.get("schedule")
        if isinstance(s, dict) and s.get("form") == "chain" and \
                known_fault(int(s.get("block_m", 0)), int(s.get("block_n", 0)), int(s.get("num_warps", 4))):
            out.append(str(k.get("name")))
    return out


def _check_plan(path: Path, graph: Graph, plan: Any) -> None:
    """A plan that cannot compute the graph's outputs from its inputs is damaged: every output
    must be written by a kernel (or be an input or constant), every primitive known."""
    if not isinstance(plan, dict) or not isinstance(plan.get("kernels"), list):
        raise ModelLoadError(f"{path}: plan.json has no kernel list; compile the model again")
    names = {n.name for n in graph.nodes}
    written = set(graph.inputs) | set(graph.constants)
    for k in plan["kernels"]:
        unknown = [p for p in list(k.get("prims", [])) + list(k.get("prologue", [])) if p not in names]
        if unknown:
            raise ModelLoadError(f"{path}: plan.json kernel {k.get('name')} names primitives {unknown[:3]} "
                                 "that the saved graph does not hold; compile the model again")
        written.update(k.get("outputs", []))
    missing = [o for o in graph.outputs if o not in written]
    if missing:
        raise ModelLoadError(f"{path}: plan.json computes no kernel that writes the outputs {missing[:3]}; "
                             "the artifact is damaged, compile the model again")
