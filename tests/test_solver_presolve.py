"""One real binary program where HiGHS's presolve lost the optimum (BERT-base tf32 on an H200,
session 30): its second subgraph, the first encoder layer. With presolve, HiGHS 1.16 answered
"optimal" at 55.07 us, keeping the attention as four kernels; CBC and HiGHS without presolve find
47.36 us, with the attention as one chain kernel. Both solvers must agree on it."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tessera.orchestrate.blp import Problem, execution_order, solve
from tessera.orchestrate.candidates import Candidate

DATA = Path(__file__).resolve().parent / "data" / "bert_base_tf32_subgraph.json.gz"


def instance() -> tuple[Problem, list[int]]:
    with gzip.open(DATA, "rt") as f:
        d = json.load(f)
    cands = [Candidate(int(n), int(o), int(i)) for n, o, i in d["candidates"]]
    return Problem(int(d["members"]), cands, [c * 1e-6 for c in d["costs_us"]], int(d["required"])), d["greedy"]


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_the_solvers_find_the_optimum_presolve_once_lost(solver: str) -> None:
    p, greedy = instance()
    _, order, stats = solve(p, solver=solver, warm=greedy, time_limit=60.0)
    assert stats.optimal
    assert sum(p.costs[c] for c in order) * 1e6 == pytest.approx(47.361, abs=1e-3)
    assert not execution_order(p, order)[1]  # the plan runs: no kernel waits on another in a cycle
