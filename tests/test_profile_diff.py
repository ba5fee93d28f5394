"""scripts/profile_diff.py: two bench rows' replay kernels grouped by name, the largest difference first."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from profile_diff import groups, main  # noqa: E402


def _row(kernels: list[tuple[str, float, int]], k64: bool) -> dict:
    sch = {"form": "gemm", "block_k": 64 if k64 else 128}
    extra = {"kernels": len(kernels), "plan": [{"name": n, "schedule": sch if "matmul" in n else None}
                                              for n, _, _ in kernels],
             "run_profile": {"total_us": sum(us for _, us, _ in kernels),
                             "kernels": [{"name": n, "us": us, "calls": c} for n, us, c in kernels]}}
    return {"model": "m", "precision": "fp16",
            "entries": [{"name": "eager", "extra": {}}, {"name": "tessera-optimal-precisionio", "extra": extra}]}


def test_kernels_group_without_their_plan_index():
    g = groups(_row([("k4_transpose_matmul", 4.5, 1), ("k13_transpose_matmul", 4.6, 1), ("k5_add", 1.0, 1)],
                    True)["entries"][1]["extra"])
    assert set(g) == {"transpose_matmul", "add"}
    assert g["transpose_matmul"][0] == 2 and abs(g["transpose_matmul"][1] - 9.1) < 1e-9


def test_the_largest_difference_comes_first_with_its_schedules(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_row([("k4_transpose_matmul", 4.5, 1), ("k5_add", 1.0, 1)], True)))
    b.write_text(json.dumps(_row([("k4_transpose_matmul", 3.5, 1), ("k5_add", 1.2, 1)], False)))
    assert main([str(a), str(b), "--schedules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, s in enumerate(lines) if s.startswith("transpose_matmul"))
    assert first < next(i for i, s in enumerate(lines) if s.startswith("add"))
    assert "+1.0" in lines[first] and "block_k=64" in lines[first + 1] and "block_k=128" in lines[first + 2]


def test_a_row_without_a_profile_is_refused(tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"entries": [{"name": "tessera-optimal", "extra": {}}]}))
    assert main([str(a), str(a)]) == 2
    assert "--profile" in capsys.readouterr().err


def test_estimates_set_each_plan_kernel_beside_what_ran_for_it(tmp_path, capsys):
    row = _row([("k4_transpose_matmul", 4.5, 1), ("k13_transpose_matmul", 4.6, 1), ("k5_add", 1.0, 1)], True)
    extra = row["entries"][1]["extra"]
    # a library call: its cuBLAS kernel and its epilogue both ran for plan kernel k8
    extra["run_profile"]["kernels"] += [
        {"name": "nvjet_sm90_hsh", "us": 5.0, "calls": 1, "plan_kernel": "k8_matmul_mul"},
        {"name": "k8_matmul_mul", "us": 1.4, "calls": 1, "plan_kernel": "k8_matmul_mul"}]
    for k in extra["run_profile"]["kernels"][:3]:
        k["plan_kernel"] = k["name"]
    extra["profile"] = {"total_cost_us": 15.0, "estimate_us": {"k4_transpose_matmul": 3.0, "k13_transpose_matmul": 3.1,
                                                               "k5_add": 1.0, "k8_matmul_mul": 5.9}}
    f = tmp_path / "a.json"
    f.write_text(json.dumps(row))
    assert main([str(f), "--estimates"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(s for s in lines if s[:1].isalpha() and not s.startswith(("estimate", "kernel")))
    assert first.startswith("transpose_matmul") and "6.1" in first and "9.1" in first and "1.49" in first
    assert any(s.startswith("matmul_mul") and "5.9" in s and "6.4" in s for s in lines)
    del extra["profile"]["estimate_us"]
    f.write_text(json.dumps(row))
    assert main([str(f), "--estimates"]) == 2
    assert "estimates" in capsys.readouterr().err
