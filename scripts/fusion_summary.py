"""Issue 14's analysis from bench rows: which fusions the plan chose around its linear kernels, and
where the library kept a GEMM or convolution (a template lost there, or had no form).

    python scripts/fusion_summary.py ROW.json [ROW.json ...] [--library]

Reads tessera's main entry of each `bench_suite.py --profile` row (`run_profile.plan`: every plan
kernel with its backend and GPU µs per call; `extra.plan`: its schedule's form) and prints, per row:
- templates by form (gemm, conv, chain) with their GPU µs;
- how many templates carry an epilogue (primitives after the linear one in the kernel's name) or
  an operand prologue (primitives before it), and the library calls left, with their µs.
With --library, each library call of each row by name. Kernel names list their primitives in
order but are cut at about 44 characters, so a long epilogue may be hidden (counted as none).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_suite import tessera_entry  # noqa: E402 - the suite's choice of tessera's main entry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tessera.ir.prims import Prim  # noqa: E402

LINEAR_OPS = ("matmul", "conv")  # conv_transpose starts with conv too
PRIMS = {p.value for p in Prim}


def _ops(name: str) -> list[str]:
    """A plan kernel's primitives from its name (`k12_transpose_matmul_add` -> transpose, matmul, add);
    a primitive whose name holds an underscore (reduce_sum, gather_elements) stays whole."""
    words, ops = name.split("_")[1:], []
    while words:
        two = "_".join(words[:2])
        take = 2 if len(words) > 1 and two in PRIMS else 1
        ops.append("_".join(words[:take]))
        words = words[take:]
    return ops


def around(name: str) -> tuple[bool, bool]:
    """(has an operand prologue, has an epilogue) of a linear kernel, from its name."""
    ops = _ops(name)
    where = [i for i, op in enumerate(ops) if op.startswith(LINEAR_OPS)]
    if not where:
        return False, False
    return where[0] > 0, where[-1] < len(ops) - 1


def summary(doc: dict) -> dict:
    entry = tessera_entry(doc)
    prof = entry["extra"]["run_profile"]
    forms = {k["name"]: (k.get("schedule") or {}).get("form") for k in entry["extra"].get("plan") or []}
    out: dict = {"model": doc["model"], "precision": doc["precision"], "total_us": prof["total_us"],
                 "forms": Counter(), "form_us": Counter(), "epilogue": 0, "prologue": 0, "library": []}
    for k in prof["plan"]:
        if k.get("backend") == "template":
            form = forms.get(k["name"]) or "template"
            out["forms"][form] += 1
            out["form_us"][form] += k["us"]
            pro, epi = around(k["name"])
            out["prologue"] += pro
            out["epilogue"] += epi
        elif k.get("backend") == "linear":
            out["library"].append((k["name"], k["us"]))
    return out


def table(docs: list[dict], library: bool) -> str:
    rows = ["| model | precision | kernel total µs | templates: gemm / conv / chain (µs) | with epilogue | "
            "with operand prologue | library calls (µs) |", "| --- | --- | ---: | --- | ---: | ---: | --- |"]
    details = []
    for doc in docs:
        s = summary(doc)
        forms = " / ".join(f"{s['forms'][f]} ({s['form_us'][f]:.1f})" for f in ("gemm", "conv", "chain"))
        lib_us = sum(us for _, us in s["library"])
        rows.append(f"| {s['model']} | {s['precision']} | {s['total_us']:.1f} | {forms} | {s['epilogue']} | "
                    f"{s['prologue']} | {len(s['library'])} ({lib_us:.1f}) |")
        if library and s["library"]:
            details.append(f"\n{s['model']} {s['precision']}: " + ", ".join(f"{n} {us:.2f}" for n, us in s["library"]))
    return "\n".join(rows) + "".join(details)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", type=Path)
    ap.add_argument("--library", action="store_true", help="also list every library call by name")
    a = ap.parse_args()
    docs = sorted((json.loads(p.read_text()) for p in a.rows), key=lambda d: (d["model"], d["precision"]))
    print(table(docs, a.library))
    return 0


if __name__ == "__main__":
    sys.exit(main())
