"""scripts/fusion_summary.py: issue 14's fusion table from a bench row (a synthetic one here)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fusion_summary import around, summary, table  # noqa: E402


def test_a_kernel_name_tells_its_prologue_and_epilogue():
    assert around("k3_slice_reshape_transpose_mul_matmul_add_r") == (True, True)
    assert around("k2_matmul_reshape") == (False, True)
    assert around("k8_matmul") == (False, False)
    assert around("k5_max_conv_add") == (True, True)
    assert around("k9_window_reduce_conv") == (True, False)  # two-word primitives stay whole
    assert around("k1_add_reduce_sum_mul") == (False, False)  # no linear primitive


def test_rows_count_templates_by_form_and_list_library_calls():
    plan = [("k0_transpose_conv_max", "template", "conv", 10.0), ("k1_reshape", "view", None, 0.0),
            ("k2_matmul_add", "template", "gemm", 4.0), ("k3_matmul", "linear", None, 6.5),
            ("k4_transpose_matmul_mul_reduce_max", "template", "chain", 3.0), ("k5_add", "triton", None, 1.0)]
    entry = {"name": "tessera-optimal-precisionio", "extra": {
        "plan": [{"name": n, "backend": b, "schedule": {"form": f} if f else None} for n, b, f, _ in plan],
        "run_profile": {"total_us": 24.5, "plan": [{"name": n, "backend": b, "us": us} for n, b, _, us in plan]}}}
    doc = {"model": "m", "precision": "fp16", "entries": [{"name": "eager", "extra": {}}, entry]}
    s = summary(doc)
    assert dict(s["forms"]) == {"conv": 1, "gemm": 1, "chain": 1} and s["form_us"]["conv"] == 10.0
    assert (s["prologue"], s["epilogue"]) == (2, 3) and s["library"] == [("k3_matmul", 6.5)]
    assert "| m | fp16 | 24.5 | 1 (4.0) / 1 (10.0) / 1 (3.0) | 3 | 2 | 1 (6.5) |" in table([doc], True)
