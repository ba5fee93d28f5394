"""Issue 14's profile target: GPU time in linear kernels plus the separate kernels of their epilogues.

    python scripts/linear_share.py --before OLD/bench_*.json --after NEW/bench_*.json

Reads `--profile`'s run profiles (bench JSON, tessera's entry) and splits each plan's GPU time per
call into:
- linear: every plan kernel that holds a matmul or convolution (library call or template, with
  whatever prologue, epilogue or chain rides inside it);
- epilogue: a generated kernel that runs right after a linear one (views skipped) and does only
  elementwise or layout work, so it is the separate epilogue the template path exists to absorb;
- between: any other generated kernel with a linear kernel on both sides (views skipped), such as
  the softmax between an attention's two matmuls, which a chain template absorbs; reported apart;
- the rest (normalizations, pooling, embeddings): not counted.

Plan kernel names list their primitives and are cut at about 44 characters, so a cut name with
no reduction visible may hide one; such a kernel is counted as an epilogue (this inflates the
"before" side and the "after" side alike). An attention chain that now holds its softmax counts
as linear, while the "before" side's separate softmax kernel did not count, which works against
the "after" side.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_suite import tessera_entry  # noqa: E402 - the suite's choice of tessera's main entry

LINEAR_BACKENDS = {"linear", "template"}
NOT_EPILOGUE = ("reduce", "gather")  # reductions, pooling, embeddings: real work of their own


def _profile(doc: dict, name: str | None = None) -> dict | None:
    """The run profile of tessera's main entry, or of the contender `name` when given."""
    entry = next((e for e in doc["entries"] if e["name"] == name), None) if name else tessera_entry(doc)
    return entry["extra"].get("run_profile") if entry else None


def split(profile: dict) -> dict[str, float]:
    """GPU µs per call: linear kernels, their separate epilogue kernels, and everything."""
    kernels = [k for k in profile["plan"] if not (k.get("backend") in ("view", "copy") and k["us"] == 0.0)]
    is_linear = [k.get("backend") in LINEAR_BACKENDS or "matmul" in k["name"] or "conv" in k["name"]
                 for k in kernels]
    linear = epilogue = between = 0.0
    for i, k in enumerate(kernels):
        before = i > 0 and is_linear[i - 1]
        after = i + 1 < len(kernels) and is_linear[i + 1]
        if is_linear[i]:
            linear += k["us"]
        elif before and k.get("backend") == "triton" and not any(t in k["name"] for t in NOT_EPILOGUE):
            epilogue += k["us"]
        elif before and after and k.get("backend") == "triton":
            between += k["us"]
    return {"linear": linear, "epilogue": epilogue, "sum": linear + epilogue, "between": between,
            "total": profile["total_us"]}


def _load(files: list[Path], name: str | None = None) -> dict[tuple[str, str], tuple[dict, dict]]:
    out = {}
    for f in files:
        doc = json.loads(f.read_text())
        prof = _profile(doc, name)
        if prof is not None and prof.get("plan"):
            out[(doc["model"], doc["precision"])] = (doc, split(prof))
    return out


def table(before: list[Path], after: list[Path], entry: str | None = None, before_entry: str | None = None) -> str:
    b, a = _load(before, before_entry), _load(after, entry)
    rows = ["| model | precision | before: linear + epilogue µs (code) | after: linear + epilogue µs (code) "
            "| change | with the kernels between, before / after µs | change | kernel total, before / after µs |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for key in sorted(set(b) & set(a)):
        (db, sb), (da, sa) = b[key], a[key]
        change = (sa["sum"] - sb["sum"]) / sb["sum"]
        wide_b, wide_a = sb["sum"] + sb["between"], sa["sum"] + sa["between"]
        rows.append(f"| {key[0]} | {key[1]} | {sb['linear']:.1f} + {sb['epilogue']:.1f} = {sb['sum']:.1f} "
                    f"({db.get('code') or '-'}) | {sa['linear']:.1f} + {sa['epilogue']:.1f} = {sa['sum']:.1f} "
                    f"({da.get('code') or '-'}) | {change:+.0%} | {wide_b:.1f} / {wide_a:.1f} | {(wide_a - wide_b) / wide_b:+.0%} "
                    f"| {sb['total']:.1f} / {sa['total']:.1f} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", nargs="+", type=Path, required=True)
    ap.add_argument("--after", nargs="+", type=Path, required=True)
    ap.add_argument("--entry", help="the after side's contender (default: the suite's main tessera entry)")
    ap.add_argument("--before-entry", help="the before side's contender (a file that holds both sides: "
                    "tessera-optimal-precisionio-notemplates)")
    a = ap.parse_args()
    print(table(a.before, a.after, a.entry, a.before_entry))
    return 0


if __name__ == "__main__":
    sys.exit(main())
