"""HiGHS (highspy) backend of the binary program."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterator

import highspy
import numpy as np

from tessera.orchestrate.blp import INF, Problem, build_rows, full_solution


def solve_problem(p: Problem, warm: list[int] | None, time_limit: float) -> tuple[list[int], str, float]:
    rows, ycol, lower, upper = build_rows(p)
    n, ncol = len(p.candidates), len(lower)
    with _quiet_stdout():  # HiGHS 1.16 prints its banner in the constructor, before any option is set
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 0.0)
    # HiGHS 1.16's presolve lost the optimum of a BERT-base tf32 subgraph: it answered "optimal" at
    # 55.07 us where CBC, and HiGHS without presolve, find 47.36 (the attention as one chain kernel).
    # tests/test_solver_presolve.py keeps that instance. HiGHS has had such presolve defects before
    # (ERGO-Code/HiGHS#2961, #3094). Without presolve, the solves of segformer_b0, bert_base and
    # efficientvit_b0 took 0.5-2.4 s per model, as with it.
    h.setOptionValue("presolve", "off")
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, rows.count
    # Costs in microseconds: in seconds they sit below the solver's tolerances.
    lp.col_cost_ = np.array([c * 1e6 for c in p.costs] + [0.0] * (ncol - n))
    lp.col_lower_, lp.col_upper_ = np.array(lower), np.array(upper)
    lp.row_lower_ = np.array([-highspy.kHighsInf if v == -INF else v for v in rows.lo])
    lp.row_upper_ = np.array([highspy.kHighsInf if v == INF else v for v in rows.hi])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(rows.starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(rows.index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(rows.value)
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n + [highspy.HighsVarType.kContinuous] * (ncol - n)
    h.passModel(lp)
    if warm is not None:
        sol = highspy.HighsSolution()
        sol.col_value = full_solution(p, warm, ycol, ncol)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal and h.getInfo().primal_solution_status == 0:
        return [], "no_solution", INF
    x = h.getSolution().col_value
    gap = h.getInfo().mip_gap
    return [c for c in range(n) if x[c] > 0.5], ("optimal" if status == "Optimal" else "time_limit"), gap


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 (C++ writes past Python's sys.stdout) for the block."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
