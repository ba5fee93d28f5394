"""Every solver backend finds the same proven optimum (cycle trap, random DAGs).

Each backend runs in its own process: highspy and OR-Tools bundle conflicting
copies of HiGHS and cannot be loaded together.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.orchestrate.blp import SOLVERS

_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from tessera.orchestrate.blp import backend, execution_order, solve
backend(sys.argv[1])
from test_orchestrate import cycle_trap, random_instance
out = []
p, a, b = cycle_trap()
chosen, order, st = solve(p, solver=sys.argv[1], warm=list(range(2, len(p.candidates))))
out.append([st.objective, st.optimal, st.cycle_cuts, bool(execution_order(p, chosen)[1])])
for seed in range(4):
    p, warm = random_instance(seed)
    chosen, order, st = solve(p, solver=sys.argv[1], warm=warm)
    out.append([st.objective, st.optimal, st.cycle_cuts, bool(execution_order(p, chosen)[1])])
print(json.dumps(out))
"""


@pytest.mark.parametrize("solver", SOLVERS)
def test_backend_is_exact(solver):
    from test_orchestrate import _brute_force, cycle_trap, random_instance

    tests_dir = str(Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", _SCRIPT, solver, tests_dir], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout)
    expected = [_brute_force(cycle_trap()[0])] + [_brute_force(random_instance(s)[0]) for s in range(4)]
    for (objective, optimal, _, stuck), best in zip(results, expected):
        assert optimal and not stuck
        assert objective == pytest.approx(best)
    assert results[0][2] >= 1  # the cycle trap needed a cut
