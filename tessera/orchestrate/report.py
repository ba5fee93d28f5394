"""`write_report`: one self-contained HTML page that explains a plan.

The page has no external resources (it must open from a results folder, offline):
inline CSS, a few lines of inline JS for highlighting, and an inline SVG of the
orchestrated primitive graph coloured by the kernel that computes each node.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from html import escape
from pathlib import Path
from typing import Any

from tessera.orchestrate.graphview import OGraph, bits
from tessera.orchestrate.plan import Kernel, Plan

# SVG geometry (px). Boxes stay small so ~1000 nodes remain a scrollable drawing.
BOX_W, BOX_H = 58, 16
GAP_X, GAP_Y = 16, 22
PAD = 12
LABEL_CHARS = 10

CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:left}
th{background:#f2f2f2}
thead th{position:sticky;top:0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,monospace;font-size:12px}
.sw{display:inline-block;width:14px;height:14px;border:1px solid #555;vertical-align:middle}
mark{background:#ffd54f}
.graph{overflow:auto;max-height:85vh;max-width:100%;border:1px solid #ccc;background:#fafafa}
.graph text{pointer-events:none}
.graph g.n.hl rect.outline{stroke:#000;stroke-width:3}
.graph g.n.dim{opacity:.25}
tr.hl{background:#fff3c4}
.note{color:#666}
"""

# Hovering a kernel row or a node highlights the kernel's nodes and rows.
JS = """
function hl(k,on){document.querySelectorAll('[data-kernels]').forEach(function(g){
 var ks=g.getAttribute('data-kernels').split(' ');
 g.classList.toggle('hl',on&&ks.indexOf(k)>=0);g.classList.toggle('dim',on&&ks.indexOf(k)<0);});
 document.querySelectorAll('tr[data-k="'+k+'"]').forEach(function(r){r.classList.toggle('hl',on);});}
// Zoom rescales the drawing through its viewBox, so a deep graph can be seen whole.
function zoom(z){var s=document.querySelector('.graph svg');
 s.setAttribute('width',s.dataset.w*z);s.setAttribute('height',s.dataset.h*z);}
document.querySelectorAll('tr[data-k]').forEach(function(r){var k=r.getAttribute('data-k');
 r.onmouseenter=function(){hl(k,true)};r.onmouseleave=function(){hl(k,false)};});
"""


def kernel_colour(kid: int) -> str:
    """A stable colour per kernel id: golden-ratio hue steps keep neighbours distinct."""
    hue = (kid * 0.618033988749895 * 360.0) % 360.0
    light = (62, 76, 69)[kid % 3]  # vary lightness too, so hues that come close still differ; dark text stays legible
    return f"hsl({hue:.1f},70%,{light}%)"


def _us(seconds: float) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    return f"{seconds * 1e6:,.2f}"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.3g}"
    return escape(str(v))


def _names(items: Iterable[str], limit: int = 4, mark: set[str] | None = None) -> str:
    """A short list inline; a long one folded into <details> so the table stays readable."""
    items = list(items)
    cells = [f"<mark>{escape(t)}</mark>" if mark and t in mark else escape(t) for t in items]
    body = "<br>".join(cells)
    if len(items) <= limit:
        return f'<span class="mono">{body}</span>'
    return f'<details><summary>{len(items)}</summary><span class="mono">{body}</span></details>'


def _table(head: list[str], rows: list[str]) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _summary(plan: Plan) -> str:
    est, greedy = plan.estimated_total_s, plan.greedy_total_s
    ratio = f"{greedy / est:.3f}×" if est > 0 else "–"
    rows = [("model", plan.model), ("device", plan.device), ("precision", plan.precision),
            ("strategy", plan.strategy), ("cost model", plan.cost_model),
            ("estimated total (µs)", _us(est)), ("greedy baseline total (µs)", _us(greedy)),
            ("greedy / estimated", ratio),
            ("greedy in the same subgraphs (µs)", _us(plan.greedy_in_subgraphs_s)),
            ("kernels", str(len(plan.kernels))),
            ("primitives", str(plan.primitives)), ("orchestrated nodes", str(plan.orchestrated_nodes)),
            ("subgraphs", str(len(plan.subgraphs))), ("orchestration (s)", f"{plan.orchestrate_s:.3f}")]
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _subgraphs(plan: Plan) -> str:
    keys = ("solver", "status", "seconds", "variables", "constraints", "cycle_cuts", "candidates_of", "solution_of")
    rows = []
    for s in plan.subgraphs:
        sol = [f"<td>{_fmt(s.solver.get(k, '–'))}</td>" for k in keys]
        rows.append(f"<tr><td class=num>{s.index}</td><td class=num>{s.nodes}</td><td class=num>{s.states}</td>"
                    f"<td class=num>{s.candidates}</td><td class=num>{s.kernels}</td>"
                    f"<td class=num>{_us(s.optimal_s)}</td><td class=num>{_us(s.greedy_s)}</td>{''.join(sol)}</tr>")
    head = ["#", "nodes", "states", "candidates", "kernels", "optimal µs", "greedy µs", "solver", "status",
            "seconds", "variables", "constraints", "cycle cuts", "candidates moved from #", "answer taken from #"]
    return _table(head, rows)


def _cuts(plan: Plan) -> str:
    if not plan.cuts:
        return '<p class="note">No cuts: the graph was solved as one subgraph.</p>'
    rows = []
    for c in plan.cuts:
        lost = [f"{p} → {q}" for p, q in c.get("lost_fusions", [])]
        rows.append(f"<tr><td class=num>{escape(str(c.get('position')))}</td><td>{_names(c.get('tensors', []))}</td>"
                    f"<td class=num>{int(c.get('bytes', 0)):,}</td><td>{_names(lost)}</td></tr>")
    return _table(["position", "tensors crossing", "bytes", "lost fusions (producer → consumer)"], rows)


def _absorbed(plan: Plan) -> str:
    """The kernels that joined a GEMM chain after the solve (`post_fusion.py`)."""
    if not plan.absorbed:
        return '<p class="note">None: no kernel that only fed a GEMM chain was left outside it.</p>'
    rows = [f"<tr><td>{_names(a['prologue'])}</td><td>{escape(a['chain'])}</td>"
            f"<td class=num>{a['before_us']:.3f}</td><td class=num>{a['after_us']:.3f}</td></tr>" for a in plan.absorbed]
    return _table(["kernel's primitives", "chain (first primitive)", "apart us", "joined us"], rows)


def _layouts(plan: Plan) -> str:
    """Buffers stored in an order other than row-major, grouped by that order."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for b in plan.buffers:
        if b.layout and b.layout != sorted(b.layout):
            groups.setdefault(tuple(b.layout), []).append(b.tensor)
    conv = [k.name for k in plan.kernels if k.conversion]
    note = (f'<p class="note">{len(conv)} conversion kernel(s): {_names(conv)}</p>' if conv
            else '<p class="note">No conversion kernels.</p>')
    if not groups:
        return '<p class="note">Every buffer is stored row-major.</p>' + note
    rows = [f"<tr><td class=mono>{escape(str(list(lay)))}</td><td class=num>{len(ts)}</td><td>{_names(ts)}</td></tr>"
            for lay, ts in groups.items()]
    return _table(["storage order (a permutation of the logical dims)", "buffers", "tensors"], rows) + note


def _kernels(plan: Plan) -> str:
    total = plan.estimated_total_s or 1.0
    rows = []
    for k in plan.kernels:
        rec = set(k.recomputed)
        prims = f"{len(k.prims)} prim{'s' * (len(k.prims) != 1)}" + (f" <mark>({len(rec)} recomputed)</mark>" if rec else "")
        prims_cell = (f'<details><summary>{prims}</summary><span class="mono">'
                      + "<br>".join(f"<mark>{escape(p)}</mark>" if p in rec else escape(p) for p in k.prims)
                      + "</span></details>")
        name = escape(k.name) + (" <mark>conversion</mark>" if k.conversion else "")
        rows.append(f'<tr data-k="{k.id}" id="k{k.id}"><td class=num>{k.id}</td><td class="mono">{name}</td>'
                    f'<td><span class="sw" style="background:{kernel_colour(k.id)}"></span></td>'
                    f"<td class=num>{k.subgraph}</td><td>{prims_cell}</td><td>{_names(k.outputs)}</td>"
                    f"<td>{_names(k.inputs)}</td><td class=num>{_us(k.cost_s)}</td>"
                    f"<td class=num>{100 * k.cost_s / total:.1f}</td><td>{_names(k.source_nodes)}</td></tr>")
    head = ["id", "name", "colour", "subgraph", "prims", "outputs", "inputs", "cost µs", "% total", "source ONNX nodes"]
    return _table(head, rows)


def _layout(og: OGraph) -> tuple[list[tuple[float, float]], float, float]:
    """Top-left corner of each node box: y by longest-path depth, x by position within the layer.

    Within a layer nodes sort by the mean x of their producers, which keeps
    chains roughly vertical and cuts down edge crossings at no real cost.
    """
    depth = [0] * og.n
    for i in range(og.n):  # og.nodes is topological: producers come first
        depth[i] = max((depth[j] + 1 for j in bits(og.preds[i])), default=0)
    layers: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for i in range(og.n):
        layers[depth[i]].append(i)
    widest = max((len(layer) for layer in layers), default=0)
    width = 2 * PAD + widest * (BOX_W + GAP_X) - GAP_X
    pos: list[tuple[float, float]] = [(0.0, 0.0)] * og.n
    for d, layer in enumerate(layers):
        def centre(i: int) -> tuple[float, int]:
            ps = bits(og.preds[i])
            return (sum(pos[j][0] for j in ps) / len(ps) if ps else 0.0, i)
        layer.sort(key=centre)
        left = PAD + (widest - len(layer)) * (BOX_W + GAP_X) / 2
        for k, i in enumerate(layer):
            pos[i] = (left + k * (BOX_W + GAP_X), PAD + d * (BOX_H + GAP_Y))
    height = 2 * PAD + len(layers) * (BOX_H + GAP_Y) - GAP_Y
    return pos, max(width, 2 * PAD), max(height, 2 * PAD)


def _node_kernels(plan: Plan) -> dict[str, list[Kernel]]:
    where: dict[str, list[Kernel]] = {}
    for k in plan.kernels:
        for p in k.prims:
            where.setdefault(p, []).append(k)
    return where


def _svg(plan: Plan, og: OGraph) -> str:
    pos, width, height = _layout(og)
    where = _node_kernels(plan)
    types = og.graph.types
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
              f'viewBox="0 0 {width:.0f} {height:.0f}" data-w="{width:.0f}" data-h="{height:.0f}">')]
    # Presentation attributes, not page CSS, so the drawing also renders when extracted on its own.
    parts.append('<g fill="none" stroke="#888" stroke-width="1">')
    # Edges first so boxes sit on top. An edge no kernel contains goes through memory.
    for i in range(og.n):
        mine = {k.id for k in where.get(og.nodes[i].name, [])}
        for j in bits(og.preds[i]):
            fused = bool(mine & {k.id for k in where.get(og.nodes[j].name, [])})
            mem = "" if fused else ' class="mem" stroke="#c33" stroke-dasharray="3 2"'
            span = round((pos[i][1] - pos[j][1]) / (BOX_H + GAP_Y))
            if span > 1:  # skips layers: run beside the boxes, not under the chain's own edges
                x1, y1 = pos[j][0] + BOX_W, pos[j][1] + BOX_H / 2
                x2, y2 = pos[i][0] + BOX_W, pos[i][1] + BOX_H / 2
                o = 9 + 1.5 * (span % 4)
                d = f"M{x1:.1f} {y1:.1f}C{x1 + o:.1f} {y1:.1f} {x2 + o:.1f} {y2:.1f} {x2:.1f} {y2:.1f}"
            else:
                x1, y1 = pos[j][0] + BOX_W / 2, pos[j][1] + BOX_H
                x2, y2 = pos[i][0] + BOX_W / 2, pos[i][1]
                my = (y1 + y2) / 2
                d = f"M{x1:.1f} {y1:.1f}C{x1:.1f} {my:.1f} {x2:.1f} {my:.1f} {x2:.1f} {y2:.1f}"
            parts.append(f'<path{mem} d="{d}"/>')
    parts.append('</g><g font-family="monospace" font-size="9" text-anchor="middle">')
    for i, node in enumerate(og.nodes):
        x, y = pos[i]
        ks = where.get(node.name, [])
        shape = ", ".join(str(types[o]) if o in types else "?" for o in node.outputs if o)
        tip = [f"{node.op}  {node.name}", f"out: {shape}",
               "kernel: " + (", ".join(k.name for k in ks) or "none"),
               "source: " + (", ".join(node.source) or "–")]
        if og.free.get(node.name):
            tip.append(f"prologue: {len(og.free[node.name])} free prims")
        kid_attr = " ".join(str(k.id) for k in ks)
        parts.append(f'<g class="n" data-node="{escape(node.name)}" data-kernels="{kid_attr}">'
                     f"<title>{escape(chr(10).join(tip))}</title>")
        # One vertical stripe per kernel computing the node: redundancy is visible at a glance.
        sw = BOX_W / max(len(ks), 1)
        for s, k in enumerate(ks):
            parts.append(f'<rect class="stripe" data-kernel="{k.id}" x="{x + s * sw:.1f}" y="{y:.1f}" '
                         f'width="{sw:.1f}" height="{BOX_H}" fill="{kernel_colour(k.id)}"/>')
        if not ks:
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" fill="#ddd"/>')
        stroke = "3" if len(ks) > 1 else "0.8"
        dash = ' stroke-dasharray="2 2"' if not ks else ""
        parts.append(f'<rect class="outline" x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" '
                     f'fill="none" stroke="#222" stroke-width="{stroke}"{dash}/>')
        label = node.op if len(node.op) <= LABEL_CHARS else node.op[:LABEL_CHARS - 1] + "…"
        parts.append(f'<text x="{x + BOX_W / 2:.1f}" y="{y + BOX_H / 2 + 3:.1f}">'
                     f"{escape(label)}</text></g>")
    parts.append("</g></svg>")
    return "\n".join(parts)


def _redundancy(plan: Plan) -> str:
    where = _node_kernels(plan)
    multi = {n: ks for n, ks in where.items() if len(ks) > 1}
    if not multi:
        return '<p class="note">No primitive is computed by more than one kernel.</p>'
    rows = [f"<tr><td class=mono>{escape(n)}</td><td class=mono>{'<br>'.join(escape(k.name) for k in ks)}</td></tr>"
            for n, ks in multi.items()]
    return _table(["recomputed primitive", "kernels"], rows)


def _rewrites(plan: Plan) -> str:
    r = plan.rewrites
    if not r:
        return '<p class="note">The rewrite search was off (tessera compile --rewrites on).</p>'
    note = (f'<p class="note">{r.get("sites", 0)} site(s) tried, {r.get("evaluated", 0)} window(s) orchestrated '
            f'({r.get("cached", 0)} from the cache) in {r.get("seconds", 0.0):.1f} s'
            + (f'; stopped: {escape(r["stopped"])}' if r.get("stopped") else "") + ".</p>")
    if not r.get("applied"):
        return note + '<p class="note">No rewrite lowered the estimated cost of its window.</p>'
    if r.get("plan_us"):  # measured compiles compare the whole tuned plans
        with_us, without_us = r["plan_us"]
        note += (f'<p class="note">The tuned plan takes {with_us:.1f} µs with these rewrites and {without_us:.1f} µs '
                 f'without: {"they are applied" if r.get("kept", True) else "they are dropped, and the plan runs without them"}.</p>')
    elif not r.get("kept", True):  # measured, and the windows promised too little to plan again
        note += (f'<p class="note">Their windows save {r.get("saved_us", 0.0):.2f} µs in all, too little of the plan '
                 'to measure the kernels they change: they are dropped, and the plan runs without them.</p>')
    rows = [f"<tr><td class=mono>{escape(a['rule'])}</td><td class=mono>{_names(a['roots'])}</td>"
            f"<td class=num>{_us(a['gain_s'])}</td><td class=num>{a['window_nodes']}</td></tr>" for a in r["applied"]]
    return note + _table(["rule", "at node(s)", "window saving µs (whole sequence)", "window nodes"], rows)


def render_report(plan: Plan, og: OGraph) -> str:
    """The report page as a string."""
    title = f"tessera plan: {plan.model}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{escape(title)}</h1>
<h2>Summary</h2>{_summary(plan)}
<h2>Graph rewrites</h2>{_rewrites(plan)}
<h2>Subgraphs</h2>{_subgraphs(plan)}
<h2>Cuts</h2>{_cuts(plan)}
<h2>Joined to GEMM chains after the solve</h2>{_absorbed(plan)}
<h2>Kernels (execution order)</h2>
<p class="note">Hover a row to highlight its nodes in the graph below. Highlighted prims are computed by
more than one kernel.</p>{_kernels(plan)}
<h2>Storage layouts</h2>{_layouts(plan)}
<h2>Redundant computation</h2>{_redundancy(plan)}
<h2>Primitive graph</h2>
<p class="note">{og.n} orchestrated nodes (free prologue prims not drawn), layered by longest path from the sources.
Colour = kernel; striped boxes with a thick outline are computed by several kernels; red dashed edges
cross a kernel boundary (the value goes through memory). Hover a box for details.</p>
<p>zoom <input type="range" min="0.05" max="2" step="0.05" value="1" oninput="zoom(this.value)"></p>
<div class="graph">{_svg(plan, og)}</div>
<script>{JS}</script>
</body></html>
"""


def write_report(plan: Plan, og: OGraph, path: Path) -> None:
    """Write the plan's report to `path` as one self-contained HTML file."""
    Path(path).write_text(render_report(plan, og), encoding="utf-8")
