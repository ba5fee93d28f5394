"""The binary program that picks kernels, and its exact solvers.

Korch's formulation, per subgraph. Variables: x_c = 1 if candidate c (a node
set with an output set) is launched; y_v = 1 if node v's value is in memory.

    minimize   sum_c cost_c x_c
    subject to y_v <= sum_{c writes v} x_c      (a value in memory was written)
               x_c <= y_u   for u read by c     (a kernel's inputs are in memory)
               y_v  = 1     for v read later or a graph output

A node may be computed by several kernels (redundant computation). Korch's
constraints alone accept selections with no valid order (DESIGN.md: two
kernels that each read what the other writes), so the solution is checked by
simulating execution, and a *cycle cut* is added for each set K of kernels
that cannot start:

    sum_{c in K} x_c - |K| + 1 <= sum_{j not in K, j writes a node in U} x_j

where U holds the inputs of K that no runnable kernel wrote. It is valid: in
any executable selection containing all of K, the first kernel of K to run
has its inputs, U's among them, written by kernels outside K. The current
selection violates it, since none of its kernels outside K wrote U. The
program is re-solved until the selection is executable, so the result is
optimal among executable selections.

Backends (`solver_*.py`): CBC through PuLP (Korch's choice, and the default:
with the warm start it was fastest on our instances, docs/orchestration.md),
HiGHS (highspy) and OR-Tools CP-SAT.
Each takes a warm start (the greedy plan) and a time limit; at the limit the
best plan found is returned, marked not optimal.
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tessera.orchestrate.candidates import Candidate
from tessera.orchestrate.graphview import bits

SOLVERS = ("cbc", "highs", "cpsat")
# CBC with the greedy warm start solved our instances fastest (scripts/bench_solvers.py). TESSERA_SOLVER
# names another default, for a machine without CBC (a name not in SOLVERS fails at the first solve).
DEFAULT_SOLVER = os.environ.get("TESSERA_SOLVER", "cbc")


@dataclass
class SolveStats:
    solver: str
    status: str  # "optimal", "time_limit" (best found), or "greedy" (nothing better found)
    optimal: bool
    gap: float
    seconds: float
    variables: int
    constraints: int
    cycle_cuts: int = 0
    solves: int = 0
    objective: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Problem:
    """One subgraph's instance: candidates, their costs, what must be in memory."""

    members: int
    candidates: list[Candidate]
    costs: list[float]
    required: int  # nodes that must be written (read later, or graph outputs)
    cuts: list[tuple[list[int], list[int]]] = field(default_factory=list)  # (K, external writers)

    def materializable(self) -> list[int]:
        m = 0
        for c in self.candidates:
            m |= c.outputs
        return bits(m & self.members)


@dataclass
class Rows:
    """A sparse system lo <= A x <= hi over variables [x_c..., y_v...]."""

    starts: list[int] = field(default_factory=lambda: [0])
    index: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)

    def add(self, coeffs: Sequence[tuple[int, float]], lo: float, hi: float) -> None:
        for i, v in coeffs:
            self.index.append(i)
            self.value.append(v)
        self.starts.append(len(self.index))
        self.lo.append(lo)
        self.hi.append(hi)

    @property
    def count(self) -> int:
        return len(self.lo)


INF = float("inf")


def build_rows(p: Problem) -> tuple[Rows, dict[int, int], list[float], list[float]]:
    """Constraint rows, the column of each y_v, and column lower/upper bounds."""
    n = len(p.candidates)
    mat = p.materializable()
    ycol = {v: n + k for k, v in enumerate(mat)}
    writers: dict[int, list[int]] = {v: [] for v in mat}
    for c, cand in enumerate(p.candidates):
        for v in bits(cand.outputs & p.members):
            writers[v].append(c)
    rows = Rows()
    for v in mat:  # sum_{c writes v} x_c - y_v >= 0
        rows.add([(c, 1.0) for c in writers[v]] + [(ycol[v], -1.0)], 0.0, INF)
    for c, cand in enumerate(p.candidates):  # y_u - x_c >= 0
        for u in bits(cand.inputs & p.members):
            if u not in ycol:
                raise ValueError(f"node {u} is read but no candidate writes it")
            rows.add([(ycol[u], 1.0), (c, -1.0)], 0.0, INF)
    # Every node of the subgraph feeds something required, so some kernel must
    # compute it. Implied by the rows above for 0/1 values, but it keeps the LP
    # relaxation from thinning the demand for inputs along a chain of
    # fractional kernels, which makes the bound many times tighter.
    covers: dict[int, list[int]] = {}
    for c, cand in enumerate(p.candidates):
        for v in bits(cand.nodes & p.members):
            covers.setdefault(v, []).append(c)
    for v in bits(p.members):
        rows.add([(c, 1.0) for c in covers.get(v, [])], 1.0, INF)
    for ks, ext in p.cuts:
        rows.add([(c, 1.0) for c in ks] + [(j, -1.0) for j in ext], -INF, len(ks) - 1.0)
    lower = [0.0] * (n + len(mat))
    for v in bits(p.required & p.members):
        if v not in ycol:
            raise ValueError(f"required node {v} is written by no candidate")
        lower[ycol[v]] = 1.0
    return rows, ycol, lower, [1.0] * (n + len(mat))


def execution_order(p: Problem, chosen: Sequence[int]) -> tuple[list[int], list[int]]:
    """Simulate: run any chosen kernel whose inputs are in memory. Returns the
    order and the kernels that could never start (empty if executable)."""
    written = 0
    pending = list(chosen)
    order: list[int] = []
    progress = True
    while pending and progress:
        progress = False
        still = []
        for c in pending:
            need = p.candidates[c].inputs & p.members
            if need & ~written == 0:
                order.append(c)
                written |= p.candidates[c].outputs
                progress = True
            else:
                still.append(c)
        pending = still
    return order, pending


def cycle_cut(p: Problem, order: Sequence[int], stuck: Sequence[int]) -> tuple[list[int], list[int]]:
    """The cut for stuck set K: some kernel outside K must write an input of K
    that nothing runnable wrote."""
    written = 0
    for c in order:
        written |= p.candidates[c].outputs
    needs = 0
    for c in stuck:
        needs |= p.candidates[c].inputs & p.members & ~written
    ks = set(stuck)
    ext = [j for j, cand in enumerate(p.candidates) if j not in ks and cand.outputs & needs]
    return list(stuck), ext


Backend = Callable[[Problem, list[int] | None, float], tuple[list[int], str, float]]


def full_solution(p: Problem, warm: list[int], ycol: dict[int, int], ncol: int) -> list[float]:
    """Column values (x then y) of the selection `warm`, for a warm start."""
    col = [0.0] * ncol
    for c in warm:
        col[c] = 1.0
        for v in bits(p.candidates[c].outputs & p.members):
            col[ycol[v]] = 1.0
    return col


def backend(name: str) -> Backend:
    """The solve function of backend `name`, imported on first use: highspy and
    OR-Tools each bundle HiGHS, and the two cannot be loaded in one process."""
    if name not in SOLVERS:
        raise ValueError(f"unknown solver '{name}'; choose one of {', '.join(SOLVERS)}")
    return importlib.import_module(f"tessera.orchestrate.solver_{name}").solve_problem


def solve(p: Problem, solver: str = DEFAULT_SOLVER, warm: list[int] | None = None, time_limit: float = 60.0,
          max_cuts: int = 1000) -> tuple[list[int], list[int], SolveStats]:
    """Choose kernels for `p`; returns (chosen candidates, their execution order, stats).

    `warm` must be an executable selection (the greedy plan); it is returned
    if the solver finds nothing better within the time limit.
    """
    run = backend(solver)
    start = time.perf_counter()
    stats = SolveStats(solver, "optimal", True, 0.0, 0.0, 0, 0)
    while True:
        left = max(time_limit - (time.perf_counter() - start), 0.01)
        chosen, status, gap = run(p, warm, left)
        stats.solves += 1
        if not chosen:
            if warm is None:
                raise RuntimeError(f"the {solver} solver found no plan and there is no warm start")
            chosen, status, gap = list(warm), "greedy", float("nan")
        order, stuck = execution_order(p, chosen)
        if not stuck:
            break
        if stats.cycle_cuts >= max_cuts:
            raise RuntimeError("too many cycle cuts")
        p.cuts.append(cycle_cut(p, order, stuck))
        stats.cycle_cuts += 1
    rows, _, lower, _ = build_rows(p)
    stats.variables, stats.constraints = len(lower), rows.count
    stats.status, stats.optimal, stats.gap = status, status == "optimal", gap
    stats.seconds = time.perf_counter() - start
    stats.objective = float(sum(p.costs[c] for c in order))
    return chosen, order, stats
