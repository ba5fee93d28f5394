"""The orchestration driver: partition, enumerate, solve, assemble the plan.

Costs come in as a function of a candidate, so this stage never depends on
how they were obtained (`cost/` is a later stage).
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from tessera.ir.prims import Prim
from tessera.orchestrate.blp import DEFAULT_SOLVER, Problem, SolveStats, execution_order, solve
from tessera.orchestrate.candidates import (Candidate, CandidateRules, KernelLegality, StructuralLegality,
                                            TooManyCandidates, enumerate_candidates)
from tessera.orchestrate.graphview import OGraph, bits, prologue_of
from tessera.orchestrate.greedy import greedy_candidates
from tessera.orchestrate.layout import is_conversion
from tessera.orchestrate.partition import Cut, Partitioner, Subgraph
from tessera.orchestrate.plan import Buffer, Kernel, Plan, SubgraphReport
from tessera.orchestrate.post_fusion import absorb_prologues
from tessera.orchestrate.repeats import producers, shifted, structure_key

STRATEGIES = ("optimal", "greedy")
CostFn = Callable[[Candidate], float]


def _index(cands: list[Candidate]) -> dict[tuple[int, int], int]:
    return {(c.nodes, c.outputs): k for k, c in enumerate(cands)}


def _candidates(og: OGraph, sub: Subgraph, strategy: str, rules: CandidateRules,
                legality: KernelLegality) -> tuple[list[Candidate], list[Candidate]]:
    """A subgraph's candidate kernels (every one, or the greedy plan's) and the greedy plan's."""
    greedy = greedy_candidates(og, sub.members, rules, legality)
    if strategy == "greedy":
        return greedy, greedy
    cands = enumerate_candidates(og, sub.members, rules, legality)
    known = _index(cands)
    return cands + [g for g in greedy if (g.nodes, g.outputs) not in known], greedy


# A solved subgraph's answer, kept for the subgraphs that repeat it: (the subgraph whose candidates
# they share, their costs, what must be written, shifted to the subgraph's first node) -> the
# solver's (order, stats, greedy order, greedy cost).
Solved = dict[tuple[int, tuple[float, ...], int], tuple[list[int], SolveStats, list[int], float]]


def _solve_subgraph(og: OGraph, sub: Subgraph, cands: list[Candidate], greedy: list[Candidate], cost: CostFn,
                    strategy: str, solver: str, time_limit: float, owner: int, solved: Solved
                    ) -> tuple[list[Candidate], list[float], SubgraphReport]:
    """`owner`: the subgraph whose candidates, moved, these are (this one's index where none).
    A subgraph that repeats a solved one with the same costs and the same nodes to write (a
    transformer's middle layers) is the same binary program over moved candidates, in the same
    order: it takes that answer instead of solving again (not under lazy measurement, whose costs
    change between its rounds)."""
    required = sub.must_output | (og.graph_outputs & sub.members)
    reused = False
    if getattr(cost, "lazy", False):
        # Lazy measurement: unmeasured candidates enter at a lower bound of their cost; the
        # kernels the solver picks are measured and the subgraph re-solved until it picks only
        # measured kernels. With true lower bounds that plan is optimal for the measured costs,
        # and most candidates are never measured.
        cost.prepare(greedy)  # the warm start is a measured plan
        rounds = 0
        while True:
            costs = [cost.estimate(c) for c in cands]
            order, stats, greedy_order, greedy_s = _pick(sub, cands, costs, greedy, strategy, solver, time_limit, required)
            todo = [cands[c] for c in order if not cost.known(cands[c])]
            rounds += 1
            if not todo:
                break
            cost.prepare(todo)
    else:  # a measured cost has measured every subgraph's candidates already (`orchestrate`)
        costs = [cost(c) for c in cands]
        key = (owner, tuple(costs), required >> sub.lo)
        reused = key in solved
        if not reused:
            solved[key] = _pick(sub, cands, costs, greedy, strategy, solver, time_limit, required)
        order, stats, greedy_order, greedy_s = solved[key]
    chosen = [cands[c] for c in order]
    solver_stats = stats.as_dict()
    if reused:
        solver_stats.update(seconds=0.0, solves=0, solution_of=owner)
    if getattr(cost, "lazy", False):
        solver_stats["measure_rounds"] = rounds
    report = SubgraphReport(sub.index, sub.members.bit_count(), sub.states, len(cands), len(chosen),
                            sum(costs[c] for c in order), greedy_s, solver_stats)
    return chosen, [costs[c] for c in order], report


def _pick(sub: Subgraph, cands: list[Candidate], costs: list[float], greedy: list[Candidate], strategy: str,
          solver: str, time_limit: float, required: int) -> tuple[list[int], SolveStats, list[int], float]:
    """Solve one subgraph's binary program (or take the greedy plan): (order, stats, greedy order, greedy cost)."""
    p = Problem(sub.members, cands, costs, required)
    where = _index(cands)
    warm = [where[(g.nodes, g.outputs)] for g in greedy]
    greedy_order, stuck = execution_order(p, warm)
    assert not stuck, "the greedy plan must be executable"
    greedy_s = sum(costs[c] for c in greedy_order)
    if strategy == "greedy":
        stats = SolveStats("none", "greedy", False, float("nan"), 0.0, len(cands), 0, objective=greedy_s)
        return greedy_order, stats, greedy_order, greedy_s
    _, order, stats = solve(p, solver=solver, warm=warm, time_limit=time_limit)
    return order, stats, greedy_order, greedy_s


def orchestrate(og: OGraph, cost: CostFn, *, strategy: str = "optimal", rules: CandidateRules | None = None,
                legality: KernelLegality | None = None, solver: str = DEFAULT_SOLVER, time_limit: float = 60.0,
                max_states: int = 2000, model: str = "", device: str = "", precision: str = "fp32",
                cost_model: str = "analytical",
                progress: Callable[[int, int], None] | None = None) -> Plan:
    """Choose the kernels of `og` and return the plan.

    `progress(done, total)` counts orchestrated primitives: called with 0 first (before the
    partition), then after each subgraph with the primitives solved so far. The total is fixed
    from the start (a partition made again for too many candidates keeps the primitives), so a
    progress bar's rate and ETA hold.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}")
    start = time.perf_counter()
    rules = rules or CandidateRules()
    legality = legality or StructuralLegality()
    if progress:
        progress(0, og.n)
    subs, cuts, found, origin = _all_candidates(og, Partitioner(og, max_states), strategy, rules, legality)
    whole = greedy_candidates(og, og.all, rules, legality)  # the greedy baseline's kernels
    _measure(cost, found, origin, whole)
    chosen: list[tuple[int, Candidate, float]] = []
    reports: list[SubgraphReport] = []
    solved: Solved = {}
    for sub, (cands, greedy), j in zip(subs, found, origin):
        picked, costs, rep = _solve_subgraph(og, sub, cands, greedy, cost, strategy, solver, time_limit,
                                             sub.index if j is None else subs[j].index, solved)
        if j is not None:  # plan.json and the report say whose candidates it took
            rep.solver["candidates_of"] = subs[j].index
        chosen += [(sub.index, c, s) for c, s in zip(picked, costs)]
        reports.append(rep)
        if progress:
            progress(sub.hi, og.n)
    greedy_total = sum(cost(c) for c in whole)  # the greedy baseline over the whole graph (no partition cuts)
    absorbed = []
    if rules.max_linear >= 2 and strategy == "optimal":  # chains on: their operands' kernels, across cuts too
        chosen, absorbed = absorb_prologues(og, chosen, cost, legality)
    kernels = _kernels(og, chosen)
    return Plan(model=model, strategy=strategy, device=device, precision=precision, cost_model=cost_model,
                kernels=kernels, buffers=_buffers(og, kernels),
                subgraphs=reports,
                cuts=[{"position": c.position, "tensors": list(c.tensors), "bytes": c.bytes,
                       "lost_fusions": [list(e) for e in c.lost_fusions]} for c in cuts],
                estimated_total_s=sum(k.cost_s for k in kernels), greedy_total_s=greedy_total,
                orchestrate_s=time.perf_counter() - start, primitives=len(og.graph.nodes),
                orchestrated_nodes=og.n, absorbed=[a.as_dict() for a in absorbed])


def _all_candidates(og: OGraph, parts: Partitioner, strategy: str, rules: CandidateRules, legality: KernelLegality
                    ) -> tuple[list[Subgraph], list[Cut], list[tuple[list[Candidate], list[Candidate]]], list[int | None]]:
    """Every subgraph's candidates (and greedy plan's) before any is priced, so that a measured cost
    times them all in one batch: per subgraph, each batch ended with the build workers draining and
    a small second round (a core's twins at its fastest schedule) that kept few of them busy.
    A subgraph that repeats an earlier one (`repeats.structure_key`: a transformer's layers) takes
    that one's candidates, moved; `origin[k]` names the subgraph they came from (None: the first of
    its structure). Where a subgraph has too many candidates, every window that holds its middle
    half is ruled out (`Partitioner.forbid`), for it and for every other subgraph of its structure,
    and the graph is partitioned again; a structure enumerated in an earlier pass keeps its
    candidates. Ruling out the window alone shrank gpt2's windows by 10-30 nodes a pass, for more
    than a dozen passes (the greedy partition before it halved such a window near its middle). The subgraphs
    and cuts returned are the final ones."""
    producer = producers(og)
    known: dict[str, tuple[int, tuple[list[Candidate], list[Candidate]]]] = {}  # key -> (lo, candidates)
    too_many: set[str] = set()
    while True:
        subs, cuts = parts.subgraphs()
        found: list[tuple[list[Candidate], list[Candidate]]] = []
        origin: list[int | None] = []
        first: dict[str, int] = {}
        ruled_out = []
        for k, sub in enumerate(subs):
            key = structure_key(og, sub, producer)
            if key not in known and key not in too_many:
                try:
                    known[key] = (sub.lo, _candidates(og, sub, strategy, rules, legality))
                except TooManyCandidates:
                    too_many.add(key)
            if key in too_many:  # (the rest of this pass still enumerates: their windows may stay)
                ruled_out.append(sub)
                found.append(([], []))  # (keeps `found` in step with `subs`; this pass is dropped)
                origin.append(None)
                continue
            lo, got = known[key]
            found.append((shifted(got[0], sub.lo - lo), shifted(got[1], sub.lo - lo)) if sub.lo != lo else got)
            origin.append(first.get(key))
            first.setdefault(key, k)
        if not ruled_out:
            return subs, cuts, found, origin
        for sub in ruled_out:
            q = (sub.hi - sub.lo) // 4 if sub.hi - sub.lo >= 8 else 0
            parts.forbid(sub.lo + q, sub.hi - q)


def _measure(cost: CostFn, found: list[tuple[list[Candidate], list[Candidate]]], origin: list[int | None],
             whole: list[Candidate]) -> None:
    """Have a measured cost time every candidate in one batch (lazily measured: only the greedy
    baseline's, each solve measures what it picks). A moved candidate computes what its original
    does (one kernel signature), so a cost that can say so (`same`) prices it as that one, without
    working its kernel out again."""
    prepare, same = getattr(cost, "prepare", None), getattr(cost, "same", None)
    if prepare is None:
        return
    if getattr(cost, "lazy", False):
        prepare(whole)
        return
    prepare([c for (cands, _), j in zip(found, origin) if same is None or j is None for c in cands] + whole)
    for (cands, _), j in zip(found, origin):
        if same is not None and j is not None:
            for c, o in zip(cands, found[j][0]):
                same(c, o)


def _kernels(og: OGraph, chosen: list[tuple[int, Candidate, float]]) -> list[Kernel]:
    times = Counter()
    for _, c, _ in chosen:
        times.update(bits(c.nodes))
    out = []
    for kid, (sub, c, cost_s) in enumerate(chosen):
        nodes = [og.nodes[i] for i in bits(c.nodes)]
        inputs: dict[str, None] = {}
        for u in bits(c.inputs):
            inputs.update((o, None) for o in og.nodes[u].outputs if o)
        for i in bits(c.nodes):
            inputs.update((t, None) for t in sorted(og.external[i]))
        outputs = [o for v in bits(c.outputs) for o in og.nodes[v].outputs if o]
        sources = sorted({s for n in nodes for s in n.source})
        cats = Counter(Prim(n.op).category.value for n in nodes)
        ops = "_".join(dict.fromkeys(n.op for n in nodes))[:40]
        # The prologue in the order signatures and code generation use (`prologue_of`).
        prologue = [f.name for f in prologue_of(og, nodes)]
        out.append(Kernel(id=kid, name=f"k{kid}_{ops}", subgraph=sub, prims=[n.name for n in nodes],
                          prologue=prologue, outputs=outputs, inputs=list(inputs), cost_s=cost_s,
                          source_nodes=sources, categories=dict(cats),
                          recomputed=[og.nodes[i].name for i in bits(c.nodes) if times[i] > 1],
                          conversion=all(is_conversion(n) for n in nodes)))
    return out


def _buffers(og: OGraph, kernels: list[Kernel]) -> list[Buffer]:
    g = og.graph
    first: dict[str, int] = {t: -1 for t in g.inputs}
    last: dict[str, int] = {}
    for k in kernels:
        for t in k.inputs:
            if t in first:
                last[t] = k.id
        for t in k.outputs:
            first.setdefault(t, k.id)
    end = len(kernels)
    outs = set(g.outputs)
    return [Buffer(t, g.types[t].nbytes, f, end if t in outs else last.get(t, f), t in outs,
                   list(g.types[t].layout or range(g.types[t].rank))) for t, f in first.items()]
