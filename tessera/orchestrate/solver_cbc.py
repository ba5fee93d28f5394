"""CBC backend through PuLP: Korch's solver, and tessera's default."""
from __future__ import annotations

import warnings

import pulp

from tessera.orchestrate.blp import INF, Problem, build_rows


def solve_problem(p: Problem, warm: list[int] | None, time_limit: float) -> tuple[list[int], str, float]:
    rows, ycol, lower, upper = build_rows(p)
    n = len(p.candidates)
    prob = pulp.LpProblem("kernels", pulp.LpMinimize)
    xs = [prob.add_variable(f"x{c}", 0, 1, cat="Binary") for c in range(n)]
    ys = [prob.add_variable(f"y{k}", lower[n + k], 1) for k in range(len(lower) - n)]
    var = xs + ys
    prob += pulp.lpSum(cost * 1e6 * x for cost, x in zip(p.costs, xs))  # microseconds
    for r in range(rows.count):
        expr = pulp.lpSum(rows.value[k] * var[rows.index[k]] for k in range(rows.starts[r], rows.starts[r + 1]))
        if rows.lo[r] != -INF:
            prob += expr >= rows.lo[r]
        if rows.hi[r] != INF:
            prob += expr <= rows.hi[r]
    if warm is not None:
        start = set(warm)
        for c, x in enumerate(xs):
            x.setInitialValue(1 if c in start else 0)
    with warnings.catch_warnings():
        # PuLP 3 deprecates its bundled-CBC command for 4.0; pyproject pins pulp < 4.
        warnings.simplefilter("ignore", DeprecationWarning)
        # Without probing cuts: CANINE's embedding subgraph took 18.7 s with them and 0.8 s without,
        # at the same optimum. Over 182 subgraph instances of 15 models (fp32 and fp16, analytical
        # cost) CBC took 23.7 s without them and 56.8 s with, every objective the same
        # (scripts/results/solver_options_2026-11-29.md).
        cbc = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, warmStart=warm is not None, gapRel=0.0,
                                options=["probingCuts off"])
    try:
        prob.solve(cbc)
    except pulp.PulpSolverError:
        # CBC stopped before writing a solution (a very short time limit): the
        # caller keeps its warm start.
        return [], "no_solution", INF
    chosen = [c for c, x in enumerate(xs) if (x.value() or 0) > 0.5]
    # prob.status says "Optimal" even when CBC stopped at the time limit with a
    # feasible solution; sol_status tells the two apart.
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    return chosen, ("optimal" if optimal else "time_limit"), 0.0 if optimal else float("nan")
