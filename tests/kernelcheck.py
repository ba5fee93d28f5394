"""Test harness for generated kernels: a model's whole primitive graph as one
Triton kernel (run by the interpreter on the CPU), compared with the float64
reference interpreter on random inputs."""
from __future__ import annotations

import os

import torch

# The cases run where the kernels are meant to: compiled for the GPU where there is one (session 46 ran
# them all so on an H200), else in Triton's interpreter on the CPU; TESSERA_TEST_DEVICE=cpu|cuda picks.
# Only the interpreter sets TRITON_INTERPRET, before Triton is imported, for the whole process: on a GPU
# machine it would make every GPU test after these refuse to run.
DEVICE = os.environ.get("TESSERA_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from typing import Any, Mapping

import numpy as np

from tessera.codegen.kernels import KernelSource, Schedule, generate
from tessera.codegen.launch import TritonKernel
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.graph import Graph
from tessera.runtime.torch_prims import TORCH_DTYPES
from tessera.tolerance import rel_l2


def one_kernel(graph: Graph, schedule: Schedule | None = None) -> KernelSource:
    return generate(graph, graph.nodes, list(graph.outputs), "k0_test", schedule)


def run_kernel(graph: Graph, ks: KernelSource, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    env = {**graph.constants, **feeds}
    args = [torch.from_numpy(np.array(env[t])).to(DEVICE, TORCH_DTYPES[graph.types[t].dtype]) for t in ks.inputs]
    outs = [torch.empty(graph.types[t].shape, dtype=TORCH_DTYPES[graph.types[t].dtype], device=DEVICE)
            for t in ks.outputs]
    TritonKernel(ks)(*args, *outs)
    return {t: (o.float() if o.dtype == torch.bfloat16 else o).cpu().numpy() for t, o in zip(ks.outputs, outs)}


def check_kernel(model: Any, feeds: Mapping[str, np.ndarray], schedule: Schedule | None = None,
                 tol: float = 1e-5, exact: bool = True) -> KernelSource:
    graph = fission(load(model).graph).graph
    ks = one_kernel(graph, schedule)
    got = run_kernel(graph, ks, feeds)
    ref = interp.run(graph, dict(feeds), exact=exact)
    for t in graph.outputs:
        err = rel_l2(got[t], ref[t])
        assert err < tol, f"{t}: rel L2 {err:.3g}\n{ks.source}"
    return ks
