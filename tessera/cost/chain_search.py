"""The GEMM-chain schedule search (MCFuser): a pruned tiling space, an analytical model, an evolutionary search.

A chain kernel (`codegen/chain.py`) has a larger space than a single GEMM: rows per program,
the intermediate's columns per step, whether K and N are walked whole or in blocks, warps and
pipeline stages. `chain_schedules` enumerates it and prunes it by MCFuser's four rules. The
model `predict_chain` prices a schedule from the SM's throughput work (tensor cores, the middle
on the CUDA cores, the operand stream) plus one program's walk latency (`predict_chain`). Its
constants are fitted to measured chains (`fit_chain_params`): the defaults to the H100's, and a
measured compile refits them from its tuning database's chains (`calibrate_from_db`). The
evolutionary search explores the space with the model as fitness and stops when its best few
stay the same for `PATIENCE` generations; the tuner (`cost/measured.py`) measures only the first
few of what it found, the best of each tiling family first. `rank_error` scores the model
against what was measured.
"""
from __future__ import annotations

import math
import random
from itertools import zip_longest
from dataclasses import dataclass, fields, replace
from typing import Callable, Sequence

from tessera.codegen.chain import ChainProblem, _Chain, chain_problem, chain_schedules, k_pieces
from tessera.codegen.kernels import ChainSchedule
from tessera.codegen.tile import cdiv
from tessera.codegen.triton_ops import Unsupported
from tessera.cost.devices import Device, device
from tessera.ir.graph import Graph, Node


@dataclass(frozen=True)
class ChainParams:
    """Constants of the chain model. The defaults are fitted (`fit_chain_params`) to 840 chain
    schedules of the 21 MCFuser cases in fp16 and tf32 measured on the H100 on 2026-11-24
    (scripts/chain_calibration.py; scripts/results/mcfuser/h100_2026-11-24/chain_samples.json); a
    tuning database that holds measured chains refits them for its GPU (`calibrate_from_db`)."""

    step_s: float = 4.7e-7  # latency of one walk step: a dot, the middle, a dot
    k_step_s: float = 2.5e-7  # latency of one K step of the first product (deep K: a loop inside the walk)
    load_s: float = 2.4e-7  # latency of a step's operand loads (B's and V's chunks) when not prefetched
    pipelined: float = 0.49  # the share of `load_s` each further pipeline stage leaves
    mma_rows: int = 128  # rows per program at which the tensor cores run at full rate
    l2_factor: float = 1.25  # the operand stream's bandwidth over DRAM's (chunks re-read by programs hit L2)
    max_warps_per_sm: int = 64
    middle_flops: float = 3.75  # CUDA-core operations per intermediate element and walk (scale, max, exp, sum)
    launch_s: float = 3.2e-7  # what a launch adds inside a CUDA graph, as the tuning measures it
    # A split walk's tail: the partial's store, the arrival counter's round trip, the last program's
    # sum of the slices (a guess until measured split chains refit it).
    sum_s: float = 8e-7


CHAIN_PARAMS = ChainParams()
POPULATION = 12
PATIENCE = 3  # generations without a change in the best TOP before the search stops
TOP = 4
MAX_GENERATIONS = 40


@dataclass(frozen=True)
class ChainFeatures:
    """What the model knows of one chain kernel besides its schedule (stored beside its measurements,
    so the model can be refitted from a tuning database)."""

    batch: int
    m: int
    k: int
    l: int
    n: int
    walks: int  # passes over L (1: online softmax or no reduction)
    itemsize: int
    operand_bytes: float  # what the kernel reads
    output_bytes: float  # and writes
    dots: str  # what its dots run on: "tensor" (16-bit operands), "tf32" or "fp32" (IEEE, CUDA cores)

    def rate(self, dev: Device) -> float:
        """FLOP/s of its dots on `dev` (as `template_rate`)."""
        return {"tensor": dev.fp16, "tf32": dev.tf32}.get(self.dots, dev.fp32)

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def chain_features(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], precision: str) -> ChainFeatures:
    """The model's view of a chain kernel; raises `Unsupported` when the kernel has no chain form."""
    ch = _Chain(graph, nodes, outputs, ChainSchedule(16, 16, 16, 16), precision)
    cp = ch.cp
    a = graph.types[cp.first.inputs[0]]
    produced = {o for n in nodes for o in n.outputs}
    reads = {t for n in nodes for t in n.inputs if t and t not in produced}
    dots = "tensor" if a.dtype.itemsize == 2 else "tf32" if precision == "tf32" else "fp32"  # as template_rate
    return ChainFeatures(cp.batch, cp.m, cp.k, cp.l, cp.n, len(ch.passes), a.dtype.itemsize,
                         float(sum(graph.types[t].nbytes for t in reads)),
                         float(sum(graph.types[t].nbytes for t in outputs)), dots)


def predict_chain(s: ChainSchedule, f: ChainFeatures, dev: Device, p: ChainParams = CHAIN_PARAMS) -> float:
    """Predicted seconds of one chain launch.

    t = launch + max(waves x per-SM time, DRAM time); an SM's time is the larger of its programs'
    tensor-core and middle work and their operand stream from L2, plus one program's walk latency
    (its steps one after another: a dot, the middle, a dot, and the operand loads that each
    further pipeline stage issues a step ahead). Fitted to measurements, this form ranked the
    H100's chains better than taking the largest of the three (scripts/chain_calibration.py)."""
    tiles = f.batch * cdiv(f.m, s.block_m) * cdiv(f.n, s.block_n) * s.split_l
    flat_k = s.block_k >= f.k
    isz = f.itemsize
    smem = s.num_stages * (s.block_k * s.block_l + s.block_l * s.block_n) * isz + s.block_m * s.block_k * isz
    live = s.block_m * s.block_n + s.block_m * s.block_l + (s.block_m * s.block_k * isz // 4 if flat_k else 0)
    regs = max(32, min(255, live // (32 * s.num_warps) + 32)) * 32 * s.num_warps
    resident = max(1, min(dev.smem_bytes // max(smem, 1), p.max_warps_per_sm // s.num_warps, dev.registers // regs))
    waves = math.ceil(tiles / (dev.sms * resident))
    per_sm = math.ceil(min(tiles, dev.sms * resident) / dev.sms)
    chunks = cdiv(cdiv(f.l, s.split_l), s.block_l)  # one program's steps (split: the longest slice's)
    kpad = sum(k_pieces(f.k)) if flat_k else cdiv(f.k, s.block_k) * s.block_k
    npad = s.block_n
    flops = 2.0 * s.block_m * s.block_l * chunks * (f.walks * kpad + npad)
    compute = per_sm * flops / (f.rate(dev) / dev.sms * min(1.0, s.block_m / p.mma_rows))
    middle = per_sm * f.walks * chunks * s.block_m * s.block_l * p.middle_flops / (dev.fp32 / dev.sms)
    operand = (f.walks * chunks * kpad * s.block_l + chunks * s.block_l * npad + s.block_m * kpad) * isz
    if s.split_l > 1:  # each program's float32 partial, written and read back once by the sum
        operand += 2 * 4 * s.block_m * s.block_n
    stream = per_sm * operand / (dev.bandwidth * p.l2_factor / dev.sms)
    steps = f.walks * chunks
    # Each further stage issues a step's loads one step earlier, hiding a share of their latency.
    load = p.load_s * p.pipelined ** (s.num_stages - 1)
    ksteps = 0 if flat_k else cdiv(f.k, s.block_k)  # deep K: a loop of loads and dots inside each step
    latency = steps * (p.step_s + load + ksteps * (p.k_step_s + load)) + (p.sum_s if s.split_l > 1 else 0.0)
    dram = (f.operand_bytes + f.output_bytes) / dev.bandwidth
    return p.launch_s + max(waves * (max(compute + middle, stream) + latency), dram)


Sample = tuple[ChainFeatures, ChainSchedule, float]  # a measured chain schedule: features, schedule, seconds
# Fitted constants and how far each step may move them (multiplicative), coordinate by coordinate.
_FITTED = ("step_s", "k_step_s", "load_s", "pipelined", "l2_factor", "middle_flops", "launch_s", "sum_s")
_MOVES = (0.25, 0.5, 0.8, 0.95, 1.05, 1.25, 2.0, 4.0)


def model_error(samples: Sequence[Sample], dev: Device, p: ChainParams) -> float:
    """The mean squared log error of the model's times over measured samples."""
    errs = [math.log(predict_chain(s, f, dev, p) / t) ** 2 for f, s, t in samples]
    return sum(errs) / len(errs) if errs else 0.0


def fit_chain_params(samples: Sequence[Sample], dev: Device, start: ChainParams = CHAIN_PARAMS,
                     rounds: int = 12) -> ChainParams:
    """The model's constants fitted to measured chain schedules (least squared log error), by
    coordinate descent over multiplicative moves and the MMA row count."""
    best, err = start, model_error(samples, dev, start)
    for _ in range(rounds):
        moved = False
        for name in _FITTED:
            for f in _MOVES:
                trial = replace(best, **{name: getattr(best, name) * f})
                if name == "pipelined" and trial.pipelined > 1.0:
                    continue
                e = model_error(samples, dev, trial)
                if e < err - 1e-9:
                    best, err, moved = trial, e, True
        for rows in (16, 32, 64, 128):
            trial = replace(best, mma_rows=rows)
            e = model_error(samples, dev, trial)
            if e < err - 1e-9:
                best, err, moved = trial, e, True
        if not moved:
            break
    return best


def rank_error(predicted: Sequence[float], measured: Sequence[float]) -> dict[str, float]:
    """How well predictions order measured schedules: the share of pairs the model orders wrongly
    (Kendall distance, 0 is perfect) and the regret (measured time of the model's first choice over
    the best measured)."""
    pairs = [(i, j) for i in range(len(measured)) for j in range(i + 1, len(measured))
             if measured[i] != measured[j]]
    wrong = sum(1 for i, j in pairs if (predicted[i] - predicted[j]) * (measured[i] - measured[j]) < 0)
    first = min(range(len(predicted)), key=predicted.__getitem__) if predicted else 0
    return {"discordant_pairs": wrong / len(pairs) if pairs else 0.0,
            "regret": measured[first] / min(measured) if measured else 1.0}


_CALIBRATED: dict[str, ChainParams] = {}  # device preset name -> params fitted from a tuning database
MIN_SAMPLES = 24  # measured chain schedules a refit needs (over at least two chains)
MAX_SAMPLES = 1000  # at most this many fit (about 3 s on one core)


def calibrate_from_db(samples: Sequence[tuple[str, Sample]], dev: Device) -> ChainParams | None:
    """Refit the model for `dev` from a tuning database's measured chains (signature, sample) and use
    the result in every later search on it; None (defaults kept) when they are too few."""
    if len(samples) < MIN_SAMPLES or len({sig for sig, _ in samples}) < 2:
        return None
    step = -(-len(samples) // MAX_SAMPLES)  # a large database: every step-th sample bounds the fit's time
    p = fit_chain_params([s for _, s in samples[::step]], dev)
    _CALIBRATED[dev.name] = p
    return p


def chain_key(s: ChainSchedule) -> str:
    """A chain schedule's name in the tuning database."""
    key = f"chain-m{s.block_m}-n{s.block_n}-l{s.block_l}-k{s.block_k}-w{s.num_warps}-s{s.num_stages}"
    key += f"-p{s.split_l}" if s.split_l > 1 else ""  # rows measured before split L keep their keys
    return key + ("-late" if s.late else "")


def parse_chain_key(key: str) -> ChainSchedule | None:
    """The schedule `chain_key` named (None for any other key)."""
    late = key.endswith("-late")
    parts = key.removesuffix("-late").split("-")
    if len(parts) not in (7, 8) or parts[0] != "chain" or (len(parts) == 8 and parts[7][:1] != "p"):
        return None
    try:
        return ChainSchedule(*(int(p[1:]) for p in parts[1:]), late=late)
    except ValueError:
        return None


def db_samples(rows: Sequence[tuple[str, str, float, dict[str, object]]]) -> list[tuple[str, Sample]]:
    """`TuningDB.chain_samples` rows as model samples (signature, sample)."""
    out = []
    for sig, key, seconds, feat in rows:
        s = parse_chain_key(key)
        if s is not None and not s.late:  # the model prices the tile, not how the kernel launches
            out.append((sig, (ChainFeatures(**feat), s, seconds)))  # type: ignore[arg-type]
    return out


def params_for(dev: Device) -> ChainParams:
    """The chain model's constants on `dev`: refitted from its database, or the defaults."""
    return _CALIBRATED.get(dev.name, CHAIN_PARAMS)


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
                 dev: Device | None = None, p: ChainParams | None = None, seed: int = 0) -> ChainSearch:
    """The chain kernel's schedules, best first, by an evolutionary search over the pruned space.

    Raises `Unsupported` when the kernel has no chain form."""
    dev = dev or device("h100")
    p = p or params_for(dev)
    f = chain_features(graph, nodes, outputs, precision)
    cp = chain_problem(graph, nodes)
    space = chain_schedules(cp, f.itemsize, dev.smem_bytes)
    predicted, generations = evolve(list(space.kept), lambda s: predict_chain(s, f, dev, p), seed)
    ranked = _families_first(sorted(predicted, key=predicted.__getitem__), cp)
    return ChainSearch(ranked, predicted, space.size, len(space.kept), space.rejected, generations, f.walks)


def chain_space(graph: Graph, nodes: Sequence[Node], dev: Device | None = None) -> tuple[ChainSchedule, ...]:
    """The chain kernel's pruned schedule space (empty when it has no chain form)."""
    try:
        cp = chain_problem(graph, nodes)
    except Unsupported:
        return ()
    itemsize = graph.types[cp.first.inputs[0]].dtype.itemsize
    return chain_schedules(cp, itemsize, (dev or device("h100")).smem_bytes).kept


def _families_first(ranked: list[ChainSchedule], cp: ChainProblem) -> list[ChainSchedule]:
    """The best of each tiling family first, in rank order, then the rest: the model compares
    schedules of one family far better than families, so the few schedules measured should span
    them. (Held out on the H100's measured chains, the best of the first six so ordered was 2.2%
    from the best measured: scripts/chain_calibration.py fit.)"""
    heads: dict[tuple[int, bool, bool], ChainSchedule] = {}
    for s in ranked:
        heads.setdefault(family(s, cp.n), s)
    # Whole and split walks alternate: the model misjudges the split's tail (on the H100 in fp16 it
    # ranked split walks first where whole ones ran 10-40% faster, session 15), so both are measured.
    whole = [s for s in heads.values() if s.split_l == 1]
    split = [s for s in heads.values() if s.split_l > 1]
    first = [s for pair in zip_longest(whole, split) for s in pair if s is not None]
    return first + [s for s in ranked if s not in heads.values()]


def family(s: ChainSchedule, n: int) -> tuple[int, bool, bool]:
    """A schedule's tiling family: rows per program, whether N (of extent `n`) is one tile, and
    whether programs split the walk over L."""
    return s.block_m, s.block_n >= n, s.split_l > 1


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
