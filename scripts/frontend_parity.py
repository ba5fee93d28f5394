"""Where the two frontends give a zoo model different primitives (issue 16: the backend's plan
against the ONNX path's), on the CPU.

    PYTHONPATH=. python3 scripts/frontend_parity.py --models bert_base,gpt2 [--json FILE]

The ONNX path reads the zoo's export (`zoo.build`, as `bench` does); the backend's path traces the
same module to ATen and bridges it to ONNX (`frontend/fx.py`, as `torch.compile(backend="tessera")`
does). Both are split into primitives (`fission`). Printed per model: the primitive counts that
differ, and each matmul's neighbourhood (operand shapes, what produces its operands, what reads its
result) on one side and not the other. Kernels that differ get other signatures, so the two plans
are tuned and chosen apart even from one database (bert_base on the H200, session 27: 24 cuBLAS
bias GEMMs through the backend where the ONNX plan has templates).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera.fission import fission  # noqa: E402
from tessera.frontend import load  # noqa: E402
from tessera.frontend.fx import to_onnx  # noqa: E402
from tessera.ir.graph import Graph  # noqa: E402
from tessera.zoo import build, make  # noqa: E402


def matmuls(g: Graph) -> collections.Counter:
    """Each matmul as (operand shapes, operand producers, result readers), counted."""
    producer = {o: n.op for n in g.nodes for o in n.outputs}
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for n in g.nodes:
        for t in n.inputs:
            readers[t].append(n.op)
    out: collections.Counter = collections.Counter()
    for n in g.nodes:
        if n.op == "matmul":
            shapes = tuple(str(g.types[t].shape) for t in n.inputs)
            made = tuple(producer.get(t, "constant" if t in g.constants else "input") for t in n.inputs)
            out[f"{' x '.join(shapes)} from {'/'.join(made)} -> {'/'.join(sorted(readers[n.outputs[0]]))}"] += 1
    return out


class _Bridged(Exception):
    """Raised from inside the backend once its graph is bridged: the plan is not needed."""

    def __init__(self, model: Any) -> None:
        super().__init__("bridged")
        self.model = model


def backend_graph(module: torch.nn.Module, args: tuple) -> Graph:
    """The primitives `torch.compile(module, backend="tessera")` compiles (its one graph), taken
    where the backend hands its ONNX bridge to the loader."""
    import tessera.torch_backend as tb
    from tessera.compiler import CompileOptions

    def capture(*a: Any, **k: Any) -> Any:
        raise _Bridged(to_onnx(*a, **k).model)

    tb.to_onnx, real = capture, tb.to_onnx
    torch._dynamo.reset()
    try:
        fn, _ = tb.dynamo_compile(module, CompileOptions(cost="analytical"))
        with torch.no_grad():
            fn(*args)
    except Exception as e:  # noqa: BLE001 - dynamo wraps what the backend raised
        while e is not None and not isinstance(e, _Bridged):
            e = e.__cause__ or e.__context__
        if e is None:
            raise
        return fission(load(e.model, checker=False).graph).graph
    finally:
        tb.to_onnx = real
    raise RuntimeError(f"{type(module).__name__}: the backend compiled without bridging a graph")


def parity(name: str) -> dict[str, Any]:
    module, args = make(name)
    with tempfile.TemporaryDirectory() as d:
        exported = fission(load(build(name, Path(d))).graph).graph
    bridged = backend_graph(module, args)
    ops = [collections.Counter(n.op for n in g.nodes) for g in (exported, bridged)]
    mms = [matmuls(g) for g in (exported, bridged)]
    return {"model": name, "primitives": [len(exported.nodes), len(bridged.nodes)],
            "ops_differing": {op: [ops[0][op], ops[1][op]] for op in sorted(set(ops[0]) | set(ops[1]))
                              if ops[0][op] != ops[1][op]},
            "matmuls_only_onnx_path": dict(mms[0] - mms[1]), "matmuls_only_backend": dict(mms[1] - mms[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert_base,gpt2")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    docs = []
    for name in a.models.split(","):
        doc = parity(name)
        docs.append(doc)
        print(f"{name}: {doc['primitives'][0]} primitives through the ONNX path, {doc['primitives'][1]} "
              "through the backend")
        for op, (x, y) in doc["ops_differing"].items():
            print(f"  {op:16s} {x:5d} {y:5d}")
        for side in ("matmuls_only_onnx_path", "matmuls_only_backend"):
            for k, v in doc[side].items():
                print(f"  {side}: {v} x {k}")
    if a.json:
        a.json.write_text(json.dumps(docs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
