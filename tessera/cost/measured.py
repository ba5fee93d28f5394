"""Measured candidate costs: kernel signatures, the tuning loop, and the cost function.

A candidate's cost is looked up in the tuning database under its signature
(the computation with tensor names erased, so the twelve identical layers of
BERT share one measurement) and the schedule; what is missing is measured by
a `Profiler` and committed at once (`cost/db.py`), so an interrupted run
resumes where it stopped and a second compile of the same model measures
nothing. The profiler is a protocol: the GPU one (`cost/profiler.py`) times
real kernels; tests pass a fake one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

from tessera.codegen.kernels import (AnySchedule, ChainSchedule, ConvSchedule, GemmSchedule, KernelSource, Schedule,
                                     TemplateSchedule)
from tessera.codegen.select import needs_template, prologue_of
from tessera.codegen.chain import STAGES as CHAIN_STAGES
from tessera.codegen.chain import WARPS as CHAIN_WARPS
from tessera.codegen.gemm import column_slices, matmul_root
from tessera.codegen.rotary import swap_width
from tessera.cost.chain_search import chain_features, chain_key, chain_space
from tessera.cost.db import Key, TuningDB
from tessera.cost.schedule_model import GEMM_FAMILIES
from tessera.cost.devices import DEVICES, Device
from tessera.ir.graph import Graph, Node
from tessera.ir.signature import kernel_signature
from tessera.ir.prims import CATEGORY_OF, REDUCTIONS, Category, Prim
from tessera.log import logger
from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import OGraph, bits, view_cost

_LIBRARY_MATH = {"matmul", "conv", "conv_transpose"}


def math_mode(prims: Sequence[Node], precision: str) -> str:
    """What besides the types changes a kernel's time: fp32 tensors multiply in full fp32 or in
    tf32 (a library flag), so an fp32 or tf32 plan's matmuls and convs are keyed by it."""
    if precision in ("fp32", "tf32") and any(n.op in _LIBRARY_MATH for n in prims):
        return precision
    return ""


FAILED_S = 1.0
CHAIN_FIRST, CHAIN_MOST = 6, 8  # GEMM-chain schedules measured at once after the solve, and at most
CHAIN_NEAR, CHAIN_STARTS = 0.1, 3  # GEMM-chain schedules this close to the fastest measured are walked from,
# at most CHAIN_STARTS per round (`_neighbours`)
# The walk's rounds, and the schedules measured per chain in all: where many schedules run within 10%
# of each other it went on for 30 rounds of a few jobs each (segformer_b0's three reduced attentions,
# 96 schedules each, counted with a fake profiler), each round a profiler batch of its own.
CHAIN_ROUNDS, CHAIN_WALK = 4, 40
CONV_FIRST = 2  # convolution template schedules measured per convolution before the solve (its cost: the least)
# After the solve, a plan's convolution measures the conv model's best CONV_TUNED: its best of 2 is
# 9.2% over the sweep space's best (geomean; worst 38%), of 4 5.8% (worst 22%) (session 24's sweep,
# scripts/results/conv_sweep/fit.json "code_ranking"). The first CONV_FIRST are timed already.
CONV_TUNED = 4
# After a GEMM template lane stops, one more round measures the rest of the space in the tile shapes
# (block_m x block_n) of its GEMM_WALK_FAMILIES fastest schedules: other K steps, stages, warps and
# splits of K, at most GEMM_WALK of them, in rank order. The model ranks schedules within a tile
# shape apart poorly for small tf32 GEMMs: on the H100 sweep of issue 15's chain products
# (scripts/gemm_probe.py --set chains, session 38) the family heads stopped 4-12% over the space's best
# for 4 of 9 shapes, and this round closed those gaps (g6 a@x 7.49 -> 6.65 us, g4 a@x 3.88 -> 3.47).
# Three shapes, not two: a shape whose best is split-K can trail on its unsplit head. With 4-warp
# small tf32 tiles ranked higher (session 39), the walk of two shapes left out g4 b@d's 64x32 tiles
# (unsplit 6.71 us, split by 4 4.53 in session 38's tuning), and gemm_g4 tf32 went from 0.82 to 0.89
# of eager on the H100. Replayed on the sweep's times (scripts/walk_replay.py), two shapes stop 7%
# over the space's best for g4 b@d and three reach it for all 9 products, for 27 more kernels timed
# in segformer_b0 fp16's cold compile (5240 against 5213, CPU count, scripts/tuning_jobs.py).
GEMM_WALK_FAMILIES, GEMM_WALK = 3, 8
CHAIN_CANDIDATE = 4  # GEMM-chain schedules measured per chain candidate before the solve (its cost: the least),
# per kind of walk (whole, split over programs: twice as many where L may be split)


@dataclass(frozen=True)
class Job:
    """One measurement to take: a kernel (as plan fields) under one schedule."""

    key: Key
    graph: Graph
    prims: tuple[Node, ...]
    prologue: tuple[Node, ...]
    outputs: tuple[str, ...]
    schedule: AnySchedule | None
    precision: str = "fp32"  # the plan's: sets the library math flags while measuring


Record = Callable[[int, float, str], None]  # (job index, seconds or inf, reason)


class Profiler(Protocol):
    def measure(self, jobs: Sequence[Job], record: Record) -> None:
        """Measure each job, calling `record` as each result arrives (seconds per launch, or inf and why)."""
        ...


def tune(jobs: Sequence[Job], profiler: Profiler, db: TuningDB,
         progress: Callable[[int, int], None] | None = None) -> dict[Key, float]:
    """Measure every job the database lacks, committing each result the moment it arrives."""
    out: dict[Key, float] = {}
    todo: list[Job] = []
    for j in jobs:
        rec = db.get(j.key)
        if rec is not None:
            out[j.key] = rec.seconds
        elif j.key not in out:
            out[j.key] = math.nan  # claimed: measured once even if several candidates share it
            todo.append(j)
    chains = {j.key.signature: j for j in todo if isinstance(j.schedule, ChainSchedule)}
    for sig, j in chains.items():  # what the chain model needs to learn from these rows, once per kernel
        db.put_features(sig, chain_features(j.graph, j.prologue + j.prims, j.outputs, j.precision).to_json())
    done = 0

    def record(i: int, seconds: float, why: str) -> None:
        nonlocal done
        if not db.put(todo[i].key, seconds, why):  # another compile measured it meanwhile: theirs stands
            rec = db.get(todo[i].key)
            seconds = rec.seconds if rec is not None else seconds
        out[todo[i].key] = seconds
        done += 1
        if progress:
            progress(done, len(todo))

    if todo:
        profiler.measure(todo, record)
    missing = [j.key for j in todo if math.isnan(out[j.key])]
    if missing:
        raise RuntimeError(f"the profiler returned no result for {len(missing)} jobs")
    return out


class MeasuredCost:
    """Candidate -> seconds from measurements (the orchestrator's cost function).

    Each candidate is measured once, at the schedule the analytical schedule model ranks
    first (`cost/schedule_model.py`); the chosen kernels search further after the solve
    (`tune_schedules`). With `templates`, a candidate built on a matmul or a 2-D convolution that
    has a template form is also measured as its best-ranked template, and costs the faster of
    the two: the binary program then weighs a template's fused epilogue against every other way
    to cover those primitives (Korch's point), instead of meeting templates only after the plan.

    Candidates that differ only in which of their values they write (Korch's recomputation: a
    value read outside may be written, or recomputed by its readers) share one measurement when
    they hold no linear primitive: the variant that writes every such value is timed, and one
    that writes less costs that time less its unwritten bytes at the device's bandwidth
    (`_variant`). A memory-bound kernel's time is its traffic; the writes it skips are the only
    difference, and the chosen kernels are measured as themselves after the solve anyway
    (`tune_schedules`). segformer_b0 fp16: 5395 generated-kernel jobs over 3299 node sets.

    `prepare(candidates)` measures what the database lacks in batches (so the
    profiler can compile in parallel); a call for a candidate not prepared
    measures it alone. A candidate that failed (compile error, timeout, GPU
    fault) costs `FAILED_S`: a second, more than any real plan, so it is
    never chosen while the greedy warm start and the cover of every node stay
    well defined (the database keeps the failure and its reason).
    """

    def __init__(self, og: OGraph, db: TuningDB, profiler: Profiler, device: str, versions: str,
                 progress: Callable[[int, int], None] | None = None,
                 bound: Callable[[Candidate], float] | None = None, precision: str = "fp32",
                 gpu: Device | None = None, templates: bool = False, share_variants: bool = True,
                 ranked: dict[str, Schedule | None] | None = None) -> None:
        self.og, self.db, self.profiler = og, db, profiler
        self.templates = templates
        self.precision = precision
        self.gpu = gpu  # the schedule model's rates (None: the H100 preset)
        # With a lower bound the orchestrator measures lazily: only what its solver picks.
        self.bound = bound
        self.lazy = bound is not None
        self.device, self.versions = device, versions
        self.progress = progress
        self._cache: dict[tuple[int, int], float] = {}
        self._jobs: dict[tuple[int, int], Job] = {}  # signatures are computed once per candidate
        # A generated kernel's first-ranked schedule by signature: a transformer's layers share it,
        # and so do the plans of one compile (`ranked`: the caller's, kept across them).
        # By signature: (the best-ranked flat schedule, None for the space's first; the best-ranked
        # tiled one of a transposing kernel, else None).
        self._ranked: dict[str, tuple[Schedule | None, Schedule | None]] = {} if ranked is None else ranked
        self._tjobs: dict[tuple[int, int], list[Job]] = {}  # the template lane, where there is one
        self._tspace: dict[str, list[TemplateSchedule]] = {}  # by signature: identical layers generate once
        # A template core (its linear primitives, by what they compute: `_core_id`) -> the signature
        # of the candidate that claimed it and the schedules that one is measured at.
        self._cores: dict[str, tuple[str, list[TemplateSchedule]]] = {}
        self._warp_pending: dict[str, Job] = {}  # chain cores claimed, not yet timed at other warps: their library job
        self._core_ids: dict[frozenset[int], str] = {}
        self.share_variants = share_variants
        self._written: list[float] | None = None  # bytes each node's outputs take (`_variant`)
        self.stats = {"candidates": 0, "measured": 0, "failed": 0, "seconds": 0.0,
                      "template_candidates": 0, "templates_faster": 0, "variants_derived": 0}

    def job(self, c: Candidate) -> Job:
        k = (c.nodes, c.outputs)
        if k not in self._jobs:
            self._jobs[k] = self._make_job(c)
        return self._jobs[k]

    def _make_job(self, c: Candidate) -> Job:
        prims = [self.og.nodes[i] for i in bits(c.nodes)]
        pro = prologue_of(self.og, prims)
        outs = [o for v in bits(c.outputs) for o in self.og.nodes[v].outputs if o]
        sig = kernel_signature(self.og.graph, prims, pro, outs, math_mode(prims, self.precision))
        if sig not in self._ranked:
            self._ranked[sig] = self._best_ranked(prims, pro, outs)
        sched = self._ranked[sig][0]
        # The space's first schedule keeps the key "default" (rows measured before ranking stay valid).
        key = "default" if sched is None else _schedule_key(sched)
        return Job(Key(self.device, self.versions, sig, key), self.og.graph, tuple(prims), tuple(pro),
                   tuple(outs), sched, self.precision)

    def _variant(self, c: Candidate) -> tuple[Candidate, float] | None:
        """(the variant of c that writes every value read outside it, the seconds c saves by
        writing less) for a candidate that writes less; None to measure c itself. A memory-bound
        candidate, or, with templates, one around matmuls: a template writes what its epilogue stores
        and no more (a library call writes its whole product, so a convolution, whose template may not
        exist, is measured itself). In the H100 tuning logs of llama and gpt2 fp16 (session 59, replayed)
        this left 40% and 27% of the GEMM templates untimed and chose the same plans."""
        if not self.share_variants:
            return None
        full = self.og.consumers_outside(c.nodes) | c.outputs
        ops = [self.og.nodes[i].op for i in bits(c.nodes)]
        if full == c.outputs or Prim.OPAQUE.value in ops or any(
                CATEGORY_OF[op] is Category.LINEAR and (op != Prim.MATMUL.value or not self.templates) for op in ops):
            return None
        gpu = self.gpu or DEVICES["h100"]
        if self._written is None:
            from tessera.cost.analytical import AnalyticalCost  # its byte counts follow the precision

            self._written = AnalyticalCost(self.og, gpu, self.precision).out_bytes
        saved = sum(self._written[i] for i in bits(full & ~c.outputs))
        return Candidate(c.nodes, full, c.inputs), saved / gpu.bandwidth

    def _derived(self, full: Candidate, saved_s: float) -> float:
        """A variant's cost: its full variant's measured seconds less `saved_s` (`_variant`). The
        bandwidth is the device's achievable one, which a measured kernel does not beat unless L2
        serves it, so the result stays near or above the variant's own traffic time (and positive)."""
        full_s = self._cache[(full.nodes, full.outputs)]
        return max(full_s - saved_s, 1e-7) if math.isfinite(full_s) else full_s

    def library_job(self, c: Candidate) -> Job | None:
        """The candidate as the library call or a generated kernel (`job`); None for a candidate
        that computes a linear primitive's operand prologue or a GEMM chain, which only a template can."""
        j = self.job(c)
        return None if needs_template(j.prims) else j

    def tiled_job(self, c: Candidate) -> Job | None:
        """The candidate as a transposing kernel at its best-ranked tiled schedule (None for every
        other kernel). Candidates were measured flat only, so the solver priced a transpose at its
        strided form: segformer_b0's decoder transposes ran 7-8x their roofline flat on the H200
        (session 42), and post-solve tuning could tile only the transposes the solver had kept."""
        j = self.library_job(c)
        sched = None if j is None else self._ranked[j.key.signature][1]
        if j is None or sched is None:
            return None
        return replace(j, key=replace(j.key, schedule=_schedule_key(sched)), schedule=sched)

    def template_jobs(self, c: Candidate, alone: bool = False) -> list[Job] | None:
        """The candidate as its best-ranked template (empty: templates off, or no template form).

        A convolution template is measured at the model's CONV_FIRST best, once per convolution
        (each form's best first where the model puts both near the top), like a GEMM's tile shapes.
        A GEMM template is measured at the schedule model's best of each of its first GEMM_FAMILIES
        tile shapes (the model orders schedules of one shape well, shapes apart poorly: session
        21's probe), once per matmul, as a chain is once per core (below). A GEMM chain is measured at its first CHAIN_CANDIDATE schedules of each kind of walk in the
        search's order (the best of each tiling family first), since the model ranks families apart
        poorly and one bad pick would lose the chain to the library calls in the binary program, but
        only once per chain core (its two linear primitives): the other candidates around the same
        core (more or less of the layout and bias prologue fused; 38 per attention block in
        segformer_b0) are measured at the fastest of the core's first candidate, so None until that
        one is measured (`alone`: not waiting, measured as a first candidate is). They share the
        library job's signature, so `tune_schedules` finds them measured."""
        k = (c.nodes, c.outputs)
        if k not in self._tjobs:
            prims = [self.og.nodes[i] for i in bits(c.nodes)]
            if not (self.templates and any(CATEGORY_OF[n.op] is Category.LINEAR for n in prims)):
                self._tjobs[k] = []
                return []
            lib = self.job(c)
            sig = lib.key.signature
            if sig not in self._tspace:
                ranked = template_space(self.og.graph, lib.prims, lib.prologue, lib.outputs, self.precision, self.gpu)
                timed = _timed(self.db, self.device, self.versions, sig, ranked)
                n_first = 1
                if ranked and isinstance(ranked[0], (ChainSchedule, GemmSchedule, ConvSchedule)):
                    if isinstance(ranked[0], ChainSchedule):
                        n_first = CHAIN_CANDIDATE * (2 if any(s.split_l > 1 for s in ranked) else 1)
                    elif isinstance(ranked[0], ConvSchedule):
                        n_first = CONV_FIRST  # the model's two best (the direct form's best leads where it is near)
                    else:
                        n_first = GEMM_FAMILIES  # the model's best of each of its first tile shapes
                    core = self._core_id(frozenset(i for i in bits(c.nodes)
                                                   if CATEGORY_OF[self.og.nodes[i].op] is Category.LINEAR)
                                         | self._sliced(lib)) + self._swapped(lib)
                    first = self._cores.setdefault(core, (sig, _with(ranked[:n_first], timed)))
                    if first[0] == sig and isinstance(ranked[0], ChainSchedule) and core not in self._warp_pending:
                        self._warp_pending[core] = lib
                    if first[0] != sig and not alone:
                        best = self._core_best(*first)
                        if best is None:
                            return None  # its core's first candidate is not measured yet
                        best, unsplit = _nearest(best, ranked), None
                        if _has_statistics(prims):  # the core's fastest unsplit, else this one's best-ranked
                            unsplit = self._core_best_unsplit(*first)
                            unsplit = _nearest(unsplit, ranked) if unsplit is not None else next(
                                (s for s in ranked if isinstance(s, GemmSchedule) and s.split_k == 1), None)
                        ranked, n_first = [best], 1
                        if unsplit is not None and unsplit != best:
                            # a norm in the prologue walks K once unsplit (`codegen/norm.py`), but takes
                            # a loop of its own under split-K: time the core's best unsplit tile too
                            ranked, n_first = [best, unsplit], 2
                self._tspace[sig] = _with(ranked[:n_first], timed)
            self._tjobs[k] = [Job(Key(self.device, self.versions, sig, _schedule_key(s)), self.og.graph, lib.prims,
                                  lib.prologue, lib.outputs, s, self.precision) for s in self._tspace[sig]]
        return self._tjobs[k]

    def _sliced(self, lib: Job) -> frozenset[int]:
        """The column slices a GEMM template reads its product through (`gemm.column_slices`): they
        belong to its core, whose tiles are a slice's and whose schedules never split K, so its
        schedules are its own, not those of the product alone."""
        root = matmul_root(lib.prims)
        cut = None if root is None else column_slices(self.og.graph, [*lib.prologue, *lib.prims], lib.outputs, root)
        return frozenset(self.og.index[n.name] for n in cut or ())

    def _swapped(self, lib: Job) -> str:
        """A mark for a GEMM template that swaps column halves in its epilogue (`codegen/rotary.py`): its
        tiles hold whole heads, so its schedules are not the product's alone (llama on the H100, session 59:
        every rotary candidate inherited the product's 32-column tile and failed to build)."""
        root = matmul_root(lib.prims)
        width = 1 if root is None else swap_width(self.og.graph, [*lib.prologue, *lib.prims], root)
        return f"|swap{width}" if width > 1 else ""

    def _core_id(self, core: frozenset[int]) -> str:
        """What a template core computes (the signature of its linear primitives alone, and for a
        GEMM chain of what lies between its two products, which every candidate around it holds),
        so that the same product in two places (a transformer's repeated layers) is claimed once:
        with every subgraph's candidates in one batch, a later layer's twin whose signature the
        first layer's twin shares was otherwise not yet known and claimed its core again."""
        if core not in self._core_ids:
            between = 0
            for a in core:
                for b in core:
                    between |= self.og.desc[a] & self.og.anc[b]
            nodes = [self.og.nodes[i] for i in sorted(set(core) | set(bits(between)))]
            outs = [o for n in nodes for o in n.outputs if o]
            self._core_ids[core] = kernel_signature(self.og.graph, nodes, [], outs, math_mode(nodes, self.precision))
        return self._core_ids[core]

    def _core_best(self, sig: str, schedules: Sequence[TemplateSchedule]) -> TemplateSchedule | None:
        """The fastest of a core's first candidate's schedules (its first where all failed);
        None while any is unmeasured."""
        fastest = self._core_fastest(sig, schedules)
        return None if fastest is None else fastest[0]

    def _core_best_unsplit(self, sig: str, schedules: Sequence[TemplateSchedule]) -> TemplateSchedule | None:
        """The fastest of a GEMM core's first schedules that does not split K (None if none did)."""
        whole = [s for s in schedules if isinstance(s, GemmSchedule) and s.split_k == 1]
        fastest = self._core_fastest(sig, whole) if whole else None
        return None if fastest is None or not math.isfinite(fastest[1]) else fastest[0]

    def _core_fastest(self, sig: str, schedules: Sequence[TemplateSchedule]) -> tuple[TemplateSchedule, float] | None:
        """`_core_best` with its time (infinite where every schedule failed)."""
        recs = [(self.db.get(Key(self.device, self.versions, sig, _schedule_key(s))), s) for s in schedules]
        if any(r is None for r, _ in recs):
            return None
        ok = [(r.seconds, i) for i, (r, _) in enumerate(recs) if r is not None and math.isfinite(r.seconds)]
        return (schedules[min(ok)[1]], min(ok)[0]) if ok else (schedules[0], math.inf)

    def _warp_twins(self) -> list[Job]:
        """Jobs timing each chain core claimed since the last call at its fastest first schedule with
        the other warp counts (CHAIN_WARPS), added to the core's schedules. The chain model prices warps
        by occupancy alone, so the first schedules come at its warps, which are often wrong: in the
        chains measured on the H100 and H200 (the committed tuning rows), 4 warps beat 8 with the rest
        the same in 74-97% of pairs for 16-64 rows per program (by 2-20% at the median), 8 beat 4 at
        128 rows.
        attn_s6 tf32 on the H200 (session 42) lost its chain kernel to three kernels in the solve,
        14.02 us at its best 8-warp first schedule against 14.1: post-solve tuning, which walks the
        warps, then had nothing to tune. One more job per core, in a batch of its own."""
        jobs: list[Job] = []
        for core, lib in self._warp_pending.items():
            sig, schedules = self._cores[core]
            fastest = self._core_fastest(sig, schedules)
            if fastest is None or not isinstance(fastest[0], ChainSchedule) or not math.isfinite(fastest[1]):
                continue
            best = fastest[0]
            space = set(chain_space(self.og.graph, list(lib.prologue) + list(lib.prims), self.gpu))
            twins = [t for w in CHAIN_WARPS if (t := replace(best, num_warps=w)) in space and t not in schedules]
            if not twins:
                continue
            self._cores[core] = (sig, [*schedules, *twins])
            self._tspace[sig] = _with(self._tspace[sig], twins)
            new = [Job(Key(self.device, self.versions, sig, _schedule_key(t)), self.og.graph, lib.prims,
                       lib.prologue, lib.outputs, t, self.precision) for t in twins]
            for js in self._tjobs.values():  # every candidate priced at this signature's schedules
                if js and js[0].key.signature == sig:
                    js.extend(new)
            jobs += new
        self._warp_pending.clear()
        return jobs

    def _best_ranked(self, prims: list[Node], pro: list[Node],
                     outs: list[str]) -> tuple[Schedule | None, Schedule | None]:
        """The schedule model's first flat choice for a generated kernel (None: the space's first,
        the default) and, for a transposing kernel, its best-ranked tiled schedule (else None)."""
        from tessera.codegen.select import implement
        from tessera.codegen.triton_ops import Unsupported
        from tessera.cost.schedule_model import rank_kernel

        try:
            ks = implement(self.og.graph, prims, pro, outs, "k").triton
        except Unsupported:
            return None, None
        if ks is None:
            return None, None
        space, ranked = rank_kernel(self.og.graph, ks, self.gpu)
        # A transposing kernel is also timed at its best-ranked tiled schedule (`tiled_job`): the
        # model does not see the coalescing that tiling buys, so it ranks the flat ones first.
        top = next(s for s in ranked if not _tiled(ks, s))
        return None if top == space[0] else top, next((s for s in ranked if _tiled(ks, s)), None)

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        t0 = time.perf_counter()
        new = list({(c.nodes, c.outputs): c for c in candidates if (c.nodes, c.outputs) not in self._cache}.values())
        # Views launch nothing at run time, but timing one measures an empty graph's replay (0.66 µs on
        # the H100), which made the solver fuse GPT-2's reshapes into slower template kernels.
        for c in new:
            v = view_cost(self.og, c.nodes)
            if v is not None:
                self._cache[(c.nodes, c.outputs)] = v
        new = [c for c in new if (c.nodes, c.outputs) not in self._cache]
        # A variant that writes less is priced from its full variant, measured in its place.
        variants = {(c.nodes, c.outputs): v for c in new if (v := self._variant(c)) is not None}
        derived = [c for c in new if (c.nodes, c.outputs) in variants]
        new = [c for c in new if (c.nodes, c.outputs) not in variants]
        queued = {(c.nodes, c.outputs) for c in new}
        new += [f for f in {(f.nodes, f.outputs): f for f, _ in variants.values()}.values()
                if (f.nodes, f.outputs) not in queued and (f.nodes, f.outputs) not in self._cache]
        jobs = [self.library_job(c) for c in new]
        tiled = [self.tiled_job(c) for c in new]
        # Smallest first, so the candidate that claims a core (`template_jobs`: its schedules are
        # measured, its twins get its fastest) is the core with the least around it. In enumeration
        # order BERT's MLP down projection was claimed by its GELU-prologue twin, whose fastest tile
        # (64x128, split-K 8: 10.6 µs for the plain GEMM) priced the plain GEMM out of the solve.
        by_size = {i: self.template_jobs(new[i]) for i in sorted(range(len(new)), key=lambda i: new[i].nodes.bit_count())}
        tjobs = [by_size[i] for i in range(len(new))]
        before = len(self.db)
        got = tune([j for j in jobs + tiled if j is not None] + [t for ts in tjobs if ts for t in ts], self.profiler,
                   self.db, progress=self.progress)
        twins = self._warp_twins()
        if twins:  # before the cores' other candidates, which take the fastest found
            got.update(tune(twins, self.profiler, self.db, progress=self.progress))
        if any(ts is None for ts in tjobs):  # chains around a core measured just now: at its fastest schedule
            tjobs = [ts if ts is not None else self.template_jobs(c) or self.template_jobs(c, alone=True) or []
                     for c, ts in zip(new, tjobs)]
            got.update(tune([t for ts in tjobs for t in ts if t.key not in got], self.profiler, self.db,
                            progress=self.progress))
        for c, j, tj, ts in zip(new, jobs, tiled, tjobs):
            lib = min(got[j.key] if j is not None else math.inf, got[tj.key] if tj is not None else math.inf)
            tpl = min((got[t.key] for t in ts or []), default=math.inf)
            self._cache[(c.nodes, c.outputs)] = min(lib, tpl)
            self.stats["template_candidates"] += bool(ts)
            self.stats["templates_faster"] += tpl < lib
        for c in derived:
            self._cache[(c.nodes, c.outputs)] = self._derived(*variants[(c.nodes, c.outputs)])
        self.stats["variants_derived"] += len(derived)
        self.stats["candidates"] += len(new) + len(derived)
        self.stats["measured"] += len(self.db) - before
        self.stats["failed"] += sum(1 for j in jobs if j is not None and not math.isfinite(got[j.key]))
        self.stats["seconds"] += time.perf_counter() - t0
        logger.info("tuning: %d candidates, %d measured now, %.1f s", len(new), len(self.db) - before,
                    time.perf_counter() - t0)

    def same(self, copy: Candidate, original: Candidate) -> None:
        """Price `copy` as `original`, measured already: the orchestrator's candidates of a subgraph
        that repeats another (`orchestrate.repeats`) compute what the originals do."""
        self._cache[(copy.nodes, copy.outputs)] = self._cache[(original.nodes, original.outputs)]

    def known(self, c: Candidate) -> bool:
        """Measured already (in this run or in the database)?"""
        k = (c.nodes, c.outputs)
        if k in self._cache:
            return True
        v = view_cost(self.og, c.nodes)
        if v is not None:
            self._cache[k] = v
            return True
        variant = self._variant(c)
        if variant is not None:
            if not self.known(variant[0]):
                return False
            self._cache[k] = self._derived(*variant)
            return True
        tjobs = self.template_jobs(c)
        if tjobs is None:
            return False
        recs = [self.db.get(j.key) for j in [self.library_job(c), self.tiled_job(c), *tjobs] if j is not None]
        if any(r is None for r in recs):
            return False
        self._cache[k] = min(r.seconds for r in recs if r is not None)
        return True

    def estimate(self, c: Candidate) -> float:
        """The measured cost if known, else the lower bound (lazy measurement)."""
        if self.known(c):
            return self(c)
        assert self.bound is not None
        return self.bound(c)

    def __call__(self, c: Candidate) -> float:
        k = (c.nodes, c.outputs)
        if k not in self._cache:
            self.prepare([c])
        s = self._cache[k]
        return s if math.isfinite(s) else FAILED_S


def tune_schedules(graph: Graph, kernels: Sequence[tuple[str, list[Node], list[Node], list[str]]],
                   db: TuningDB, profiler: Profiler, device: str, versions: str, first: int = 2,
                   most: int = 5, progress: Callable[[int, int], None] | None = None,
                   precision: str = "fp32", gpu: Device | None = None,
                   converge: float = 0.03, templates: bool = True) -> dict[str, tuple[AnySchedule, float]]:
    """After the plan is chosen: find each generated kernel's fastest schedule, measuring few.

    Post-scheduling tuning (Hidet): the plan's kernels are few, so each can try several block
    sizes and warp counts without multiplying the candidate count. Which to try comes from the
    analytical schedule model (MCFuser): the `first` best-ranked schedules and the space's default
    are measured, then the next in rank while the last one measured beat the best before it by
    `converge` or more, up to `most`. The candidate's own measurement (at the model's first
    choice, or the default) is reused, not taken again. Kernels are measured together, round by
    round, so the profiler builds in parallel. Kernels are given as (name, prims, prologue,
    outputs); returns name -> (fastest schedule, seconds).

    With `templates`, a kernel with a matmul or a 2-D convolution also tries its templates
    (`codegen/gemm.py`, `codegen/conv.py`): a second lane of schedules, ranked by the template
    roofline (`rank_templates`), measured by the same rule beside the library lane (the library
    call with its epilogue kernel's schedules, or alone under the key "default"); the fastest of
    both lanes wins. A kernel whose library call alone wins has nothing to tune and is left out,
    as before. A GEMM template lane ends with one round over the tile shapes of its fastest
    schedules (`_family_walk`); a GEMM chain's walks its neighbours (`_neighbours`).
    """
    from tessera.codegen.select import implement
    from tessera.codegen.triton_ops import Unsupported
    from tessera.cost.schedule_model import rank_kernel

    lanes: dict[tuple[str, str], list[Job]] = {}  # (kernel, "generated" | "library" | "template") -> queue
    # GEMM chains: (job maker, pruned space, schedules refined around) for the neighbour walk below
    refine: dict[str, tuple[Callable[[AnySchedule | None], Job], set[ChainSchedule], set[ChainSchedule]]] = {}
    families: dict[str, tuple[Callable[[AnySchedule | None], Job], list[GemmSchedule]]] = {}  # GEMM templates' walk
    firsts: dict[tuple[str, str], int] = {}
    measured: dict[str, list[tuple[AnySchedule | None, float]]] = {}
    # A chain schedule that faulted the GPU for one kernel is not run for another: Triton has
    # miscompiled some (codegen/chain.py known_fault) into kernels that fault now and then, so one
    # clean timing does not clear it (gpt2's plan on the H200, session 26).
    unsafe = db.faulted(device, versions, "chain-")
    for name, prims, prologue, outputs in kernels:
        try:
            impl = implement(graph, prims, prologue, outputs, name)
        except Unsupported:
            impl = None  # no library or generated form: a kernel with an operand prologue has templates only
        ks = impl.triton if impl is not None else None
        tpl = template_space(graph, prims, prologue, outputs, precision, gpu) \
            if templates and (impl is None or impl.backend == "linear") else []
        if ks is None and not tpl:
            continue
        sig = kernel_signature(graph, prims, prologue, outputs, math_mode(prims, precision))
        job = _job_maker(Key(device, versions, sig, ""), graph, prims, prologue, outputs, precision)

        measured[name] = []
        default = db.get(Key(device, versions, sig, "default"))
        known = default is not None and math.isfinite(default.seconds)
        if ks is not None:
            space, ranked = rank_kernel(graph, ks, gpu)
            # The space's first schedule is always among the first measured: a safety net where the
            # model ranks schedules it has no measurements for. So is the best-ranked tiled schedule
            # of a transposing kernel: the model does not see the coalescing that tiling buys.
            nets = [space[0]] + [s for s in ranked if _tiled(ks, s)][:1]
            ranked = ranked[:most]
            order = list(dict.fromkeys(ranked[:first] + nets + ranked[first:]))
            lane = (name, "generated")
            firsts[lane] = len(dict.fromkeys(ranked[:first] + nets))
            lanes[lane] = [job(sch) for sch in order]
            if known:
                # The candidate was measured at the space's first schedule already: no second timing.
                measured[name].append((space[0], default.seconds))
                lanes[lane] = [j for j in lanes[lane] if j.schedule != space[0]]
                firsts[lane] -= 1
        elif known:  # the library call alone: the candidate's own measurement
            measured[name].append((None, default.seconds))
        elif impl is not None:
            lanes[(name, "library")], firsts[(name, "library")] = [job(None)], 1
        tpl = [s for s in tpl if not (isinstance(s, ChainSchedule) and _schedule_key(s) in unsafe)]
        if tpl:
            # A GEMM chain's space spans tiling families the model ranks apart poorly: its lane
            # measures the best of CHAIN_FIRST families at once (cost/chain_search.py orders them).
            chain = isinstance(tpl[0], ChainSchedule)
            n_first, n_most = (CHAIN_FIRST, CHAIN_MOST) if chain else (first, most)
            if isinstance(tpl[0], GemmSchedule):
                # The model ranks tile shapes apart poorly, so the head of each of its first
                # GEMM_FAMILIES shapes is measured, as before the solve (where only the candidate
                # that claims a core gets its own): BERT's MLP-down lane stopped before its fourth
                # head, the session-21 probe's winner.
                n_first, n_most = max(first, GEMM_FAMILIES), max(most, GEMM_FAMILIES + 1)
                families[name] = (job, tpl)  # a GEMM's template space: GemmSchedules only
            elif isinstance(tpl[0], ConvSchedule):
                # Before the solve a convolution is timed at the model's best CONV_FIRST (other
                # candidates around it at that one's faster), so a first round of CONV_FIRST timed
                # one new schedule at most, and a library call that won by a hair kept its kernel
                # (16 of inception_v3 fp16's 23 library convolutions were within 3%, session 34).
                n_first, n_most = max(first, CONV_TUNED), max(most, CONV_TUNED + 1)
            # Schedules of the space the database already timed (the layout pass's, an earlier
            # compile's) join the first round for free, ahead of it, so its last stays the model's.
            free = [s for s in _timed(db, device, versions, sig, tpl) if s not in tpl[:n_first]]
            lanes[(name, "template")] = [job(s) for s in _with(free, tpl[:n_most])]
            firsts[(name, "template")] = len(free) + n_first
            if chain:
                refine[name] = (job, {s for s in chain_space(graph, list(prologue) + list(prims), gpu)
                                      if _schedule_key(s) not in unsafe}, set())

    def take(lane: tuple[str, str], n: int) -> list[Job]:
        out, lanes[lane] = lanes[lane][:n], lanes[lane][n:]
        return out

    batch = {lane: take(lane, max(0, firsts[lane])) for lane in lanes}
    walked: dict[str, int] = {}  # chain kernel -> rounds of its neighbour walk
    late_twins = _pdl_timing(versions)  # the walk also times its starts launched late (`_neighbours`)
    while any(batch.values()):
        jobs = [j for js in batch.values() for j in js]
        got = tune(jobs, profiler, db, progress=progress)
        before = {name: min((t for _, t in runs), default=math.inf) for name, runs in measured.items()}
        nxt: dict[tuple[str, str], list[Job]] = {}
        for lane, js in batch.items():
            for j in js:
                measured[lane[0]].append((j.schedule, got[j.key]))
            last = got[js[-1].key] if js else math.inf
            improving = math.isfinite(last) and last < before[lane[0]] * (1 - converge)
            nxt[lane] = take(lane, 1) if js and improving and lane[1] != "library" else []
            left = CHAIN_WALK - len(measured[lane[0]])
            if lane[1] == "template" and lane[0] in refine and walked.get(lane[0], 0) < CHAIN_ROUNDS and left > 0:
                walked[lane[0]] = walked.get(lane[0], 0) + 1
                nxt[lane] = _neighbours(refine[lane[0]], measured[lane[0]], late_twins)[:left] or nxt[lane]
            if lane[1] == "template" and not nxt[lane] and lane[0] in families:
                nxt[lane] = _family_walk(*families.pop(lane[0]), measured[lane[0]])
        batch = nxt
    best: dict[str, tuple[AnySchedule, float]] = {}
    unsafe = db.faulted(device, versions, "chain-")  # with what this tuning found
    for name, runs in measured.items():
        ok = [(s, t) for s, t in runs if math.isfinite(t)
              and not (isinstance(s, ChainSchedule) and _schedule_key(s) in unsafe)]
        if ok:
            sch, t = min(ok, key=lambda r: r[1])
            if sch is not None:
                best[name] = (sch, t)
    return best


def _has_statistics(prims: Sequence[Node]) -> bool:
    """Does a one-product kernel compute row statistics in its operand prologue (a norm)?"""
    return any(Prim(n.op) in REDUCTIONS for n in prims) \
        and sum(1 for n in prims if CATEGORY_OF[n.op] is Category.LINEAR) == 1


def _timed(db: TuningDB | None, device: str, versions: str, signature: str,
           space: Sequence[AnySchedule]) -> list[AnySchedule]:
    """The schedules of `space` that `db` holds a time for under `signature`, in `space`'s order:
    free to read. The layout pass times each convolution alone at its own best-ranked templates,
    which can be faster than the ones the candidate's ranking puts first (inception_v3 fp16 on the
    H100, session 34: a template at 2.10 µs in the database, the plan's library call at 2.51)."""
    if db is None or not space:
        return []
    have = db.timed(device, versions, signature)
    return [s for s in space if _schedule_key(s) in have] if have else []


def _with(head: Sequence[AnySchedule], timed: Sequence[AnySchedule]) -> list[AnySchedule]:
    """`head`, then the `timed` schedules it lacks."""
    return list(dict.fromkeys([*head, *timed]))


def _job_maker(key: Key, graph: Graph, prims: Sequence[Node], prologue: Sequence[Node], outputs: Sequence[str],
               precision: str) -> Callable[[AnySchedule | None], Job]:
    """Jobs of one kernel under any schedule (`key` names the kernel; its schedule is replaced)."""
    def job(sch: AnySchedule | None) -> Job:
        k = Key(key.device, key.versions, key.signature, "default" if sch is None else _schedule_key(sch))
        return Job(k, graph, tuple(prims), tuple(prologue), tuple(outputs), sch, precision)
    return job


def _family_walk(job: Callable[[AnySchedule | None], Job], space: Sequence[GemmSchedule],
                 runs: Sequence[tuple[AnySchedule | None, float]]) -> list[Job]:
    """A GEMM template's last round (GEMM_WALK_FAMILIES): the unmeasured schedules of `space`, in its
    rank order, that share a tile shape with one of the fastest measured GEMM schedules."""
    ok = sorted(((s, t) for s, t in runs if isinstance(s, GemmSchedule) and math.isfinite(t)), key=lambda r: r[1])
    shapes: list[tuple[int, int]] = []
    for s, _ in ok:
        if (s.block_m, s.block_n) not in shapes:
            shapes.append((s.block_m, s.block_n))
    shapes = shapes[:GEMM_WALK_FAMILIES]
    tried = {s for s, _ in runs}
    return [job(s) for s in space if (s.block_m, s.block_n) in shapes and s not in tried][:GEMM_WALK]


def _neighbours(state: tuple[Callable[[AnySchedule | None], Job], set[ChainSchedule], set[ChainSchedule]],
                runs: Sequence[tuple[AnySchedule | None, float]], late_twins: bool = False) -> list[Job]:
    """A GEMM chain's next measurements: the neighbours (within the pruned space, not yet measured)
    with other warps or pipeline stages, or half or twice the row block, the output column block,
    the L step, K step or L split, of each chain schedule measured within CHAIN_NEAR of the fastest,
    each walked from once. The row and column blocks are walked because the tiling families measured
    first need not hold the best: attn_s6 tf32 on the H100 tuned to m16 n128 l64 k128 w4 s3 at
    10.84 us in session 41, where session 37 had run m32 n128 with the rest the same at 9.62. The tiling
    families measured first are each represented by the model's pick, whose warps the model gets
    wrong (attn_s2 fp16 on the H100: 4 warps ran 1.44x faster than the model's 8,
    scripts/chain_probe.py), and the family fastest at the model's warps need not be fastest at its
    best (attn_s2 fp16, session 14: m128 n32 w8 at 8.97 us beat m64 n64 w8 at 9.18 us, the family of
    the probe's 4-warp winner)."""
    job, space, done = state
    # `late_twins` (the tuning times PDL launches): each start's twin launched late (`ChainSchedule.late`:
    # only as the kernel before it ends). Timed back to back under PDL, attn_s3's fastest tile (m64 n64
    # l128 k64 w4 s3) ran 8.59 µs where it ran 6.85 without PDL and 6.2 in the plan's replay (session 63).
    ok = [(s, t) for s, t in runs if isinstance(s, ChainSchedule) and math.isfinite(t)]
    if not ok:
        return []
    fastest = min(t for _, t in ok)
    starts = [s for s, t in sorted(ok, key=lambda r: r[1])
              if t <= fastest * (1 + CHAIN_NEAR) and s not in done][:CHAIN_STARTS]
    done.update(starts)
    tried = {s for s, _ in runs}
    near = [n for b in starts for n in (
        *(replace(b, num_warps=w) for w in CHAIN_WARPS), *(replace(b, num_stages=st) for st in CHAIN_STAGES),
        replace(b, block_m=b.block_m // 2), replace(b, block_m=b.block_m * 2),
        replace(b, block_n=b.block_n // 2), replace(b, block_n=b.block_n * 2),
        replace(b, block_l=b.block_l // 2), replace(b, block_l=b.block_l * 2),
        replace(b, block_k=b.block_k // 2), replace(b, block_k=b.block_k * 2),
        replace(b, split_l=b.split_l // 2), replace(b, split_l=b.split_l * 2),
        *((replace(b, late=not b.late),) if late_twins else ()))]
    return [job(s) for s in dict.fromkeys(near) if replace(s, late=False) in space and s not in tried]


def _pdl_timing(versions: str) -> bool:
    """Whether the tuning's candidates are timed as programmatic-dependent launches: its database's
    versions say so (`db.software_versions`: "timing N pdl")."""
    return "pdl" in versions.split(";")[0].split()


def _nearest(best: TemplateSchedule, ranked: Sequence[TemplateSchedule]) -> TemplateSchedule:
    """`best` (a core's fastest GEMM schedule) where this candidate's own space holds it, else the nearest
    there: the best-ranked of `best`'s schedule with a wider block_n, else the best-ranked of all. A
    candidate around the core may admit fewer schedules (an epilogue's own constraints), and an inherited
    schedule outside them fails to build."""
    if not isinstance(best, GemmSchedule) or best in ranked or not ranked:
        return best  # (a chain's ranked schedules are its search's few, not its whole space)
    for s in ranked:
        if isinstance(s, GemmSchedule) and s.block_n >= best.block_n and replace(s, block_n=best.block_n) == best:
            return s
    return ranked[0]


def template_space(graph: Graph, prims: Sequence[Node], prologue: Sequence[Node], outputs: Sequence[str],
                    precision: str, gpu: Device | None) -> list[TemplateSchedule]:
    """A matmul or convolution kernel's template schedules, best-ranked first; empty when it has no
    template form (the generator says so at the first schedule)."""
    from tessera.codegen.select import implement
    from tessera.codegen.triton_ops import Unsupported
    from tessera.cost.schedule_model import rank_templates

    ranked = rank_templates(graph, list(prologue) + list(prims), outputs, precision, gpu)
    if not ranked:
        return []
    try:
        implement(graph, prims, prologue, outputs, "k", (), ranked[0], precision)
    except Unsupported:
        return []
    return ranked


def _tiled(ks: KernelSource, s: Schedule) -> bool:
    """A tiled pointwise schedule of a kernel that can take one (`codegen.kernels.tile_shape`)."""
    return ks.tile is not None and s.rblock > 1


def _schedule_key(s: AnySchedule) -> str:
    """The tuning database's schedule column (the strings of generated kernels' schedules and GEMM
    templates' never change; convolution templates' start with "conv-", and a split-K one's ends in
    "-sk<n>"; a split-K GEMM's ends in "-1l" since its slices are summed in one launch: times of the
    two-launch form stay apart)."""
    if isinstance(s, ChainSchedule):
        return chain_key(s)
    if isinstance(s, ConvSchedule):
        return (f"conv-m{s.block_m}-n{s.block_n}-k{s.block_k}-w{s.num_warps}-s{s.num_stages}-g{s.group_m}"
                + (f"-sk{s.split_k}" if s.split_k > 1 else ""))
    if isinstance(s, GemmSchedule):
        return (f"gemm-m{s.block_m}-n{s.block_n}-k{s.block_k}-w{s.num_warps}-s{s.num_stages}-g{s.group_m}"
                f"-sk{s.split_k}" + ("-1l" if s.split_k > 1 else ""))
    return f"x{s.xblock}-r{s.rblock}-w{s.num_warps}-{'p' if s.persistent else 'l'}"
