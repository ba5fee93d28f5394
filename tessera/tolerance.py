"""The tolerance table: the one place that says how close is close enough.

Outputs are judged by relative L2 error ||out - ref|| / ||ref|| (DESIGN.md).
NaN never passes; integer and bool outputs must match exactly.
"""
from __future__ import annotations

import numpy as np

TOLERANCE: dict[str, float] = {
    "fp32": 1e-5,
    "tf32": 1e-3,
    "fp16": 1e-2,
    "bf16": 1e-2,
}

# How far a template kernel's outputs may stray from the library kernel's on the same inputs
# (`cost/profiler.py`, before a template candidate is timed). Both round at the plan's precision,
# in different orders, so this is looser than TOLERANCE against a float64 reference; a
# miscompiled tile is off by 1e-1 or more (session 8: 0.29-0.42).
AGREEMENT: dict[str, float] = {"fp32": 1e-4, "tf32": 5e-3, "fp16": 1e-2, "bf16": 2e-2}


def rel_l2(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| in float64; inf on NaN or a shape mismatch.

    Integer and bool tensors give 0.0 when equal and inf otherwise. An all-zero
    reference falls back to the absolute error.
    """
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return float("inf")
    if ref.dtype.kind in "biu" and out.dtype.kind in "biu":
        return 0.0 if np.array_equal(out, ref) else float("inf")
    o, r = out.astype(np.float64), ref.astype(np.float64)
    if np.isnan(o).any() or np.isnan(r).any():
        same_nan = np.array_equal(np.isnan(o), np.isnan(r))
        if not same_nan or np.isnan(r).all():
            return float("inf")
        keep = ~np.isnan(r)
        o, r = o[keep], r[keep]
    if np.isinf(o).any() or np.isinf(r).any():
        if not np.array_equal(o[np.isinf(r)], r[np.isinf(r)]) or np.isinf(o[~np.isinf(r)]).any():
            return float("inf")
        keep = ~np.isinf(r)
        o, r = o[keep], r[keep]
    denom = float(np.linalg.norm(r))
    err = float(np.linalg.norm(o - r))
    return err / denom if denom > 0 else err


def weak_reference(ref: np.ndarray) -> str:
    """Why a check against `ref` shows little, or "": a float output of more than one element whose
    finite values are all one number (a model whose activations vanish gives all zeros, and any
    kernel that also writes that number passes)."""
    r = np.asarray(ref)
    if r.dtype.kind != "f" or r.size < 2:
        return ""
    finite = r[np.isfinite(r)]
    if finite.size < 2 or finite.min() != finite.max():
        return ""
    return (f"the reference is constant ({float(finite[0]):g} everywhere): a wrong result may still pass; "
            "check with other inputs or weights")


def passes(err: float, precision: str = "fp32") -> bool:
    return bool(np.isfinite(err)) and err < TOLERANCE[precision]
