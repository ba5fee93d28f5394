"""OR-Tools CP-SAT backend, kept for comparison (extra `solvers`).

Never load it in a process that has loaded highspy (see blp.backend).
"""
from __future__ import annotations

from ortools.sat.python import cp_model

from tessera.orchestrate.blp import INF, Problem, build_rows, full_solution


def solve_problem(p: Problem, warm: list[int] | None, time_limit: float) -> tuple[list[int], str, float]:
    rows, ycol, lower, upper = build_rows(p)
    n = len(p.candidates)
    m = cp_model.CpModel()
    var = [m.NewBoolVar(f"x{c}") for c in range(n)] + [m.NewBoolVar(f"y{k}") for k in range(len(lower) - n)]
    for k, lo in enumerate(lower):
        if lo >= 1:
            m.Add(var[k] == 1)
    for r in range(rows.count):
        terms = [(int(rows.value[k]), var[rows.index[k]]) for k in range(rows.starts[r], rows.starts[r + 1])]
        expr = sum(c * v for c, v in terms)
        if rows.lo[r] != -INF:
            m.Add(expr >= int(rows.lo[r]))
        if rows.hi[r] != INF:
            m.Add(expr <= int(rows.hi[r]))
    scale = 1e10  # CP-SAT needs integer costs: 0.1 ns units
    m.Minimize(sum(int(round(c * scale)) * var[k] for k, c in enumerate(p.costs)))
    if warm is not None:
        for k, v in enumerate(full_solution(p, warm, ycol, len(lower))):
            m.AddHint(var[k], int(v))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = 2
    st = solver.Solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return [], "no_solution", INF
    chosen = [c for c in range(n) if solver.Value(var[c])]
    gap = 0.0 if st == cp_model.OPTIMAL else abs(solver.ObjectiveValue() - solver.BestObjectiveBound()) / max(
        abs(solver.ObjectiveValue()), 1e-30)
    return chosen, ("optimal" if st == cp_model.OPTIMAL else "time_limit"), gap
