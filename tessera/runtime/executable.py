"""An executable plan: the chosen kernels, run in plan order on torch tensors.

Each kernel of the plan runs its primitives (free prologue first) and keeps
the values the plan says it writes; everything else it computed is dropped
when the kernel ends, as on-chip intermediates would be. This is the torch
backend every kernel can fall back to; generated Triton kernels, buffer reuse
and CUDA-graph replay come with the code generator (issue 4).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from tessera.errors import ShapeError
from tessera.ir.graph import Graph, Node
from tessera.runtime.torch_prims import TORCH_DTYPES, run_node


@dataclass(frozen=True)
class Step:
    """One kernel: its primitives in order, and the tensors it keeps."""

    name: str
    nodes: tuple[Node, ...]
    writes: tuple[str, ...]


def build_steps(graph: Graph, plan: Mapping[str, Any]) -> list[Step]:
    """The plan's kernels (in execution order) as steps over `graph`'s nodes."""
    by_name = {n.name: n for n in graph.nodes}
    order = {n.name: i for i, n in enumerate(graph.topological_order())}
    steps = []
    for k in plan["kernels"]:
        names = sorted(set(k["prologue"]) | set(k["prims"]), key=order.__getitem__)
        steps.append(Step(k["name"], tuple(by_name[n] for n in names), tuple(k["outputs"])))
    return steps


class Executable:
    """Runs a primitive graph kernel by kernel, as a plan orders it."""

    def __init__(self, graph: Graph, plan: Mapping[str, Any], device: str | torch.device = "cpu") -> None:
        self.graph = graph
        self.plan = plan
        self.device = torch.device(device)
        self.steps = build_steps(graph, plan)
        self.constants = {name: torch.from_numpy(np.array(v, order="C")).to(
            self.device, TORCH_DTYPES[graph.types[name].dtype]) for name, v in graph.constants.items()}
        # An fp32 plan means fp32 arithmetic: torch would run convs and matmuls in tf32 on Ampere+.
        self.allow_tf32 = plan.get("precision") == "tf32"
        last_read: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for n in step.nodes:
                for t in n.inputs:
                    last_read[t] = i
        # Values to drop after each step: read for the last time there, and
        # neither a graph output nor a constant (those live for the whole run).
        self._free_after: list[list[str]] = [[] for _ in self.steps]
        for t, i in last_read.items():
            if t and t not in graph.outputs and t not in self.constants:
                self._free_after[i].append(t)

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def _feeds(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        if args and kwargs:
            raise TypeError("pass inputs by position or by name, not both")
        named = dict(zip(self.graph.inputs, args)) if args else dict(kwargs)
        if len(args) > len(self.graph.inputs) or set(named) != set(self.graph.inputs):
            raise ShapeError(f"the model takes inputs {self.graph.inputs}, got {list(named) or len(args)}")
        feeds = {}
        for name, v in named.items():
            t = self.graph.types[name]
            x = torch.as_tensor(v).to(self.device)
            if tuple(x.shape) != t.shape:
                raise ShapeError(f"input '{name}' has shape {list(x.shape)}, the model takes {list(t.shape)}")
            feeds[name] = x.to(TORCH_DTYPES[t.dtype])
        return feeds

    def run(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Outputs by name, for inputs given by position or by name."""
        env: dict[str, torch.Tensor] = {**self.constants, **self._feeds(args, kwargs)}
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        try:
            with torch.no_grad(), torch.backends.cudnn.flags(allow_tf32=self.allow_tf32):
                self._run_steps(env)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        return {t: env[t] for t in self.graph.outputs}

    def _run_steps(self, env: dict[str, torch.Tensor]) -> None:
        for i, step in enumerate(self.steps):
            local: dict[str, torch.Tensor] = {}
            for n in step.nodes:
                ins = [local[t] if t in local else env[t] for t in n.inputs if t]
                outs = run_node(n, ins, [self.graph.types[o] for o in n.outputs if o],
                                device=self.device, opsets=self.graph.opsets)
                local.update(zip([o for o in n.outputs if o], outs))
            for t in step.writes:  # what the kernel writes to memory, as its own buffer
                env[t] = local[t].contiguous()
            for t in self._free_after[i]:
                env.pop(t, None)

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        outs = self.run(*args, **kwargs)
        return [outs[t] for t in self.graph.outputs]
