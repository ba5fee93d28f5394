"""`tessera inspect`: what the frontend and fission make of a model."""
from __future__ import annotations

from collections import Counter
from typing import Any, Mapping, Sequence

from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.prims import Category, Prim


def summarize(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """A JSON-ready description of the model's operator and primitive graphs."""
    loaded = load(source, input_shapes)
    g = loaded.graph
    result = fission(g)
    pg = result.graph
    by_cat: Counter = Counter(Prim(n.op).category.value for n in pg.nodes)
    return {
        "model": loaded.label,
        "opsets": dict(g.opsets),
        "inputs": [{"name": i, "type": str(g.types[i])} for i in g.inputs],
        "outputs": [{"name": o, "type": str(g.types[o])} for o in g.outputs],
        "operators": {"total": len(g.nodes), "counts": g.op_counts()},
        "primitives": {
            "total": len(pg.nodes),
            "by_category": {c.value: by_cat.get(c.value, 0) for c in Category},
            "counts": pg.op_counts(),
        },
        "opaque": [{"node": o.node, "op": o.op_type, "reason": o.reason} for o in result.opaque],
        "folding": loaded.folding.as_dict(),
    }


def format_summary(s: Mapping[str, Any]) -> str:
    """The human-readable form of `summarize`'s result."""
    lines = [f"model    {s['model']}",
             "opsets   " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in s["opsets"].items())]
    for kind in ("inputs", "outputs"):
        for t in s[kind]:
            lines.append(f"{kind[:-1]:<8} {t['name']}: {t['type']}")
    ops = s["operators"]
    lines.append(f"\noperators ({ops['total']})")
    lines += _columns(ops["counts"])
    prims = s["primitives"]
    lines.append(f"\nprimitives ({prims['total']})")
    lines.append("  " + "  ".join(f"{c}={n}" for c, n in prims["by_category"].items()))
    lines += _columns(prims["counts"])
    lines.append(f"\nopaque ({len(s['opaque'])})")
    for o in s["opaque"]:
        lines.append(f"  {o['node']} ({o['op']}): {o['reason']}")
    f = s["folding"]
    lines.append(f"\nfolded constants: {f['folded_total']} nodes folded, {f['dead_nodes_removed']} dead nodes removed, "
                 f"{f['constants']} constants ({f['constant_bytes'] / 1e6:.2f} MB)")
    if f["folded_nodes"]:
        lines += _columns(f["folded_nodes"])
    for w in f["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _columns(counts: Mapping[str, int], width: int = 4) -> list[str]:
    items = [f"{k:<22}{v:>5}" for k, v in counts.items()]
    return ["  " + "   ".join(items[i:i + width]) for i in range(0, len(items), width)]
