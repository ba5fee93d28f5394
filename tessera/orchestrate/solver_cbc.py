"""CBC backend through PuLP: Korch's solver, kept for comparison (extra `solvers`)."""
from __future__ import annotations

import pulp

from tessera.orchestrate.blp import INF, Problem, build_rows


def solve_problem(p: Problem, warm: list[int] | None, time_limit: float) -> tuple[list[int], str, float]:
    rows, ycol, lower, upper = build_rows(p)
    n = len(p.candidates)
    prob = pulp.LpProblem("kernels", pulp.LpMinimize)
    xs = [pulp.LpVariable(f"x{c}", cat="Binary") for c in range(n)]
    ys = [pulp.LpVariable(f"y{k}", lowBound=lower[n + k], upBound=1) for k in range(len(lower) - n)]
    var = xs + ys
    prob += pulp.lpSum(cost * 1e6 * x for cost, x in zip(p.costs, xs))  # microseconds
    for r in range(rows.count):
        expr = pulp.lpSum(rows.value[k] * var[rows.index[k]] for k in range(rows.starts[r], rows.starts[r + 1]))
        if rows.lo[r] != -INF:
            prob += expr >= rows.lo[r]
        if rows.hi[r] != INF:
            prob += expr <= rows.hi[r]
    if warm is not None:
        for c, x in enumerate(xs):
            x.setInitialValue(1 if c in set(warm) else 0)
    prob.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, warmStart=warm is not None, gapRel=0.0))
    chosen = [c for c, x in enumerate(xs) if (x.value() or 0) > 0.5]
    optimal = pulp.LpStatus[prob.status] == "Optimal"
    return chosen, ("optimal" if optimal else "time_limit"), 0.0 if optimal else float("nan")
