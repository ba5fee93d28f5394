"""A kernel's signature: what a set of primitives computes, by structure, not by tensor names.

The tuning database keys measurements by it (`cost/measured.py`), the code generator's legality
verdicts are shared by it (`codegen/select.py`), and the orchestrator tells repeated subgraphs by
it (`orchestrate/repeats.py`): two node sets with one signature generate the same kernel.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

from tessera.ir.graph import Graph, Node
from tessera.ir.tables import table_form


def kernel_signature(graph: Graph, prims: Sequence[Node], prologue: Sequence[Node], outputs: Sequence[str],
                     math: str = "") -> str:
    """A stable name for what a kernel computes: ops, attributes, types and wiring, not tensor names
    (and the math mode, where it matters: `cost.measured.math_mode`)."""
    ids: dict[str, str] = {}

    def tid(t: str) -> str:
        if t not in ids:
            # A scalar constant's value is in the generated source (Graph.scalar_constant).
            one = graph.scalar_constant(t) if t else None
            # A tensor stored rounded to tf32 is written or read differently (Graph.tf32_rounded).
            mark = (f"={one!r}" if one is not None else "") + ("~tf32" if t in graph.tf32_rounded else "")
            form = table_form(graph, t) if t and one is None else None
            if form is not None:  # computed from the position: its form is in the source
                mark += "~" + form.describe()
            ids[t] = f"t{len(ids)}:{graph.types[t]}{mark}" if t else ""
        return ids[t].split(":")[0] if ids[t] else ""

    parts = []
    for n in list(prologue) + list(prims):
        ins = [tid(t) for t in n.inputs]
        outs = [tid(t) for t in n.outputs]
        attrs = sorted((k, repr(v)) for k, v in n.attrs.items())
        parts.append(f"{n.op}({','.join(ins)})->{','.join(outs)}{attrs}")
    parts.append("types:" + ";".join(ids.values()))
    parts.append("writes:" + ",".join(tid(t) for t in outputs))
    if math:
        parts.append("math:" + math)
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:24]
