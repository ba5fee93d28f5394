"""The GEMM-chain schedule search (MCFuser): a pruned tiling space, an analytical model, an evolutionary search.

A chain kernel (`codegen/chain.py`) has a larger space than a single GEMM: rows per program,
the intermediate's columns per step, whether K and N are walked whole or in blocks, warps and
pipeline stages. `chain_schedules` enumerates it and prunes it by MCFuser's four rules. The
model `predict_chain` prices a schedule as t = max(waves x per-SM time, DRAM time), where an
SM's time is the largest of its programs' tensor-core work, their operand stream from L2, and
the latency of their walk steps one after another (each step: a dot, the middle, a dot; the
pipeline hides loads, not this chain of dependences). The evolutionary search explores the
space with the model as fitness and stops when its best few stay the same for `PATIENCE`
generations; post-scheduling (`cost/measured.py`, `tune_schedules`) measures only the top
of what it found. The constants are guesses, not yet fitted to the measured chains in the
tuning database.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields, replace
from typing import Callable, Sequence

from tessera.codegen.chain import ChainProblem, _Chain, chain_schedules
from tessera.codegen.kernels import ChainSchedule
from tessera.codegen.tile import cdiv
from tessera.cost.devices import Device, device
from tessera.cost.schedule_model import template_rate
from tessera.ir.graph import Graph, Node


@dataclass(frozen=True)
class ChainParams:
    """Constants of the chain model (H100 guesses, not yet fitted to measurements)."""

    step_s: float = 1.5e-7  # latency of one walk step that the pipeline does not hide
    k_step_s: float = 1.0e-7  # latency of one K step of the first product (deep K: a loop inside the walk)
    mma_rows: int = 64  # rows a Hopper warpgroup MMA takes: fewer rows per program leave tensor cores idle
    l2_factor: float = 4.0  # L2 over DRAM bandwidth: operand chunks are mostly L2 hits
    max_warps_per_sm: int = 64
    middle_flops: float = 12.0  # CUDA-core operations per intermediate element and walk (scale, max, exp, sum)


CHAIN_PARAMS = ChainParams()
POPULATION = 12
PATIENCE = 3  # generations without a change in the best TOP before the search stops
TOP = 4
MAX_GENERATIONS = 40


def predict_chain(s: ChainSchedule, cp: ChainProblem, walks: int, itemsize: int, operand_bytes: float,
                  output_bytes: float, rate: float, dev: Device, p: ChainParams = CHAIN_PARAMS) -> float:
    """Predicted seconds of one chain launch (only the ranking is meant to be right)."""
    tiles = cp.batch * cdiv(cp.m, s.block_m) * cdiv(cp.n, s.block_n)
    flat_k = s.block_k >= cp.k
    smem = s.num_stages * (s.block_k * s.block_l + s.block_l * s.block_n) * itemsize + s.block_m * s.block_k * itemsize
    live = s.block_m * s.block_n + s.block_m * s.block_l + (s.block_m * s.block_k * itemsize // 4 if flat_k else 0)
    regs = max(32, min(255, live // (32 * s.num_warps) + 32)) * 32 * s.num_warps
    resident = max(1, min(dev.smem_bytes // max(smem, 1), p.max_warps_per_sm // s.num_warps, dev.registers // regs))
    waves = math.ceil(tiles / (dev.sms * resident))
    per_sm = math.ceil(min(tiles, dev.sms * resident) / dev.sms)
    chunks = cdiv(cp.l, s.block_l)
    kpad = cdiv(cp.k, s.block_k) * s.block_k
    npad = s.block_n
    flops = 2.0 * s.block_m * s.block_l * chunks * (walks * kpad + npad)
    compute = per_sm * flops / (rate / dev.sms * min(1.0, s.block_m / p.mma_rows))
    middle = per_sm * walks * chunks * s.block_m * s.block_l * p.middle_flops / (dev.fp32 / dev.sms)
    operand = (walks * chunks * kpad * s.block_l + chunks * s.block_l * npad + s.block_m * kpad) * itemsize
    stream = per_sm * operand / (dev.bandwidth * p.l2_factor / dev.sms)
    steps = walks * chunks
    latency = steps * p.step_s + (0 if flat_k else steps * cdiv(cp.k, s.block_k) * p.k_step_s)
    dram = (operand_bytes + output_bytes) / dev.bandwidth
    return max(waves * max(compute + middle, stream, latency), dram)


@dataclass
class ChainSearch:
    """One chain's search: the ranking it found and how it got there."""

    ranked: list[ChainSchedule]  # every schedule the search priced, best first
    predicted: dict[ChainSchedule, float]
    space: int  # schedules before pruning
    pruned: int  # after pruning
    rejected: dict[str, int]
    generations: int  # until the best TOP stopped changing
    walks: int

    def summary(self) -> dict[str, object]:
        return {"space": self.space, "after_pruning": self.pruned, "rejected": self.rejected,
                "generations": self.generations, "priced": len(self.ranked), "walks": self.walks,
                "best": self.ranked[0].to_json() if self.ranked else None}


def chain_search(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], precision: str = "fp32",
                 dev: Device | None = None, p: ChainParams = CHAIN_PARAMS, seed: int = 0) -> ChainSearch:
    """The chain kernel's schedules, best first, by an evolutionary search over the pruned space.

    Raises `Unsupported` when the kernel has no chain form."""
    dev = dev or device("h100")
    ch = _Chain(graph, nodes, outputs, ChainSchedule(16, 16, 16, 16), precision)
    cp = ch.cp
    a = graph.types[cp.first.inputs[0]]
    itemsize = a.dtype.itemsize
    space = chain_schedules(cp, itemsize, dev.smem_bytes)
    produced = {o for n in nodes for o in n.outputs}
    reads = {t for n in nodes for t in n.inputs if t and t not in produced}
    operand_bytes = float(sum(graph.types[t].nbytes for t in reads))
    output_bytes = float(sum(graph.types[t].nbytes for t in outputs))
    rate = template_rate(a.dtype, precision, dev)
    walks = len(ch.passes)

    def fitness(s: ChainSchedule) -> float:
        return predict_chain(s, cp, walks, itemsize, operand_bytes, output_bytes, rate, dev, p)

    predicted, generations = evolve(list(space.kept), fitness, seed)
    ranked = _families_first(sorted(predicted, key=predicted.__getitem__), cp)
    return ChainSearch(ranked, predicted, space.size, len(space.kept), space.rejected, generations, walks)


def _families_first(ranked: list[ChainSchedule], cp: ChainProblem) -> list[ChainSchedule]:
    """The best of each tiling family (rows per program, flat or deep K, whole or split N) first, in
    rank order, then the rest: the model compares schedules of one family far better than families,
    so the few schedules measured should span them."""
    heads: dict[tuple[int, bool, bool], ChainSchedule] = {}
    for s in ranked:
        heads.setdefault((s.block_m, s.block_k >= cp.k, s.block_n >= cp.n), s)
    first = list(heads.values())
    return first + [s for s in ranked if s not in heads.values()]


def evolve(space: Sequence[ChainSchedule], fitness: Callable[[ChainSchedule], float], seed: int = 0,
           population: int = POPULATION, patience: int = PATIENCE, top: int = TOP,
           max_generations: int = MAX_GENERATIONS) -> tuple[dict[ChainSchedule, float], int]:
    """Every schedule the search priced (schedule -> predicted seconds) and the generations it ran.

    Each generation breeds children from the fittest: a crossover of two parents' fields and a
    mutation that moves one field to another value the space holds; children outside the
    (pruned) space are dropped. The search stops when its best `top` are the same `patience`
    generations running, or the space is exhausted."""
    if not space:
        return {}, 0
    rng = random.Random(seed)
    members = set(space)
    names = [f.name for f in fields(ChainSchedule)]
    values = {n: sorted({getattr(s, n) for s in space}) for n in names}
    priced: dict[ChainSchedule, float] = {}

    def price(s: ChainSchedule) -> float:
        if s not in priced:
            priced[s] = fitness(s)
        return priced[s]

    pop = rng.sample(list(space), min(population, len(space)))
    for s in pop:
        price(s)
    best: list[ChainSchedule] = []
    still = 0
    gen = 0
    while gen < max_generations and len(priced) < len(space):
        gen += 1
        parents = sorted(pop, key=price)[:max(2, population // 2)]
        children: list[ChainSchedule] = []
        for _ in range(4 * population):
            if len(children) >= population:
                break
            x, y = rng.sample(parents, 2) if len(parents) > 1 else (parents[0], parents[0])
            child = ChainSchedule(**{n: getattr(x if rng.random() < 0.5 else y, n) for n in names})
            n = rng.choice(names)
            child = replace(child, **{n: rng.choice(values[n])})
            if child in members and child not in children:
                children.append(child)
        for c in children:
            price(c)
        pop = sorted(set(pop) | set(children), key=price)[:population]
        now = sorted(priced, key=priced.__getitem__)[:top]
        still = still + 1 if now == best else 0
        best = now
        if still >= patience:
            break
    return priced, gen
