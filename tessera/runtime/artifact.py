"""The artifact directory `tessera compile -o OUT` writes and `tessera.load` reads.

    OUT/plan.json      the plan (kernels, order, buffers, solver statistics)
    OUT/report.html    the plan for a person
    OUT/graph.pkl      the primitive graph with its constants
    OUT/model.onnx     the source model, the reference for `tessera run --check`
    OUT/artifact.json  format version, tessera version, precision, input shapes

Loading re-plans nothing: the executable is built from the saved graph and plan.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import onnx
import torch

from tessera.errors import ModelLoadError
from tessera.ir.graph import Graph
from tessera.runtime.executable import Executable

FORMAT = 1


def save_artifact(out: Path, graph: Graph, model: onnx.ModelProto, meta: dict[str, Any]) -> None:
    """Write what `load_artifact` needs beside plan.json (which the caller wrote)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "graph.pkl", "wb") as f:
        pickle.dump(graph, f, protocol=4)
    onnx.save(model, str(out / "model.onnx"))
    (out / "artifact.json").write_text(json.dumps({"format": FORMAT, **meta}, indent=1))


def read_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / "artifact.json"
    if not meta_path.is_file():
        raise ModelLoadError(f"{path}: not a tessera artifact (no artifact.json); make one with tessera compile -o")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: artifact.json is damaged ({e}); compile the model again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise ModelLoadError(f"{path}: artifact format {got} is not {FORMAT}; compile it again")
    return meta


def load_artifact(path: str | Path, device: str | torch.device = "cpu") -> Executable:
    """The executable saved in `path`, on `device`."""
    path = Path(path)
    read_meta(path)
    try:
        with open(path / "graph.pkl", "rb") as f:
            graph = pickle.load(f)
        plan = json.loads((path / "plan.json").read_text())
    except (OSError, pickle.UnpicklingError, json.JSONDecodeError, EOFError) as e:
        raise ModelLoadError(f"{path}: the artifact is damaged ({e}); compile it again") from None
    _check_plan(path, graph, plan)
    try:
        return Executable(graph, plan, device)
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise ModelLoadError(f"{path}: plan.json does not match the saved graph ({type(e).__name__}: {e}); "
                             "the artifact is damaged, compile it again") from None


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
