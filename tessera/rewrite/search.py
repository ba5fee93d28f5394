"""Which rewrites to apply: each one kept only where the plan it leads to costs less.

The graph is searched site by site, in node order. A site is one match of one rule. Around it a
window is cut: the matched nodes, every node within `radius` hops of them, and the free nodes
(fills, weight reshapes) they read. The window is orchestrated as it is and after the rewrite,
with the compile's own cost model (`evaluate`: measured on a GPU, analytical elsewhere), and
sequences of up to `depth` rewrites inside the window are tried (a beam, TASO-style: Korch's
softmax needs three steps before the first one pays). The cheapest sequence is applied if it beats
the window as it was; a tie goes to the graph with fewer nodes.

Both windows have the same boundary, since a rewrite keeps the names of the tensors its roots
wrote, so their costs compare like for like. Windows are evaluated before the layout pass (every
tensor row-major). Costs are cached by the window's structure, so the twelve layers of a
transformer cost one evaluation each. After `budget_s` the search prices no new window (one
may be in flight) and goes on only with sites whose windows are priced already.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from tessera.ir.graph import Graph, GraphKind
from tessera.ir.prims import Category, Prim
from tessera.log import logger
from tessera.rewrite.rules import RULES, Match, NotApplicable, Rule, View, apply, find

GAIN = 0.005  # a sequence must save this fraction of its window's cost (the analytical model's)
# A measured window's saving must be larger: on the H100 (session 21) sequences kept for measured
# savings of 0.4-3% of their windows left the segformer and EfficientViT blocks 5-16% slower.
MEASURED_GAIN = 0.03
# A measured compile plans the graph again with the kept rewrites only if their windows' savings add
# up to this fraction of the plan without them: the second plan measures every kernel the rewrites
# change, about a cold compile of the subgraphs they touch (issue 17 allows the rewrites 60 s).
REPLAN_GAIN = 0.03
TIE = 0.001  # within this, the graph with fewer nodes wins
SMALL_CONSTANT = 64  # elements: a window's signature holds the values of constants up to this size
# The rules a compile's search may apply, by `CompileOptions.rewrites`. "regroup" (the default) has
# only the chain of two products grouped the other way where that does fewer multiply-adds, and the
# fold of the product of weights that leaves: on the H100 it ran MCFuser's GEMM chains G9-G12 at
# 0.35-0.81 of eager's two calls where the first grouping ran at 0.77-1.08 (sessions 38-39), and in
# the benchmark models it finds no site, so their compiles price no window. "on" has every rule:
# it made no benchmark model faster and costs up to 31 s of a cold compile (session 37).
REWRITE_MODES = ("off", "regroup", "on")
REGROUP_RULES = ("matmul_associative", "fold_constant_matmul")
# Rules that may continue a regroup sequence inside its window but open no site of their own, so a
# model without a regroup site still prices no window. MCFuser's G6 in tf32 pays only for the
# regrouping followed by `matmul_transposed` on the product it makes (session 39, `--rewrites on`:
# 13.96 us planned with both, 15.72 without; the regrouping alone saved nothing).
REGROUP_FOLLOW = ("matmul_transposed",)


def rewrite_rules(mode: str) -> dict[str, Rule]:
    """The rules a search in `mode` (one of REWRITE_MODES) may apply."""
    if mode not in REWRITE_MODES:
        raise ValueError(f"rewrites must be one of {', '.join(REWRITE_MODES)}, not {mode!r}")
    names = () if mode == "off" else RULES if mode == "on" else REGROUP_RULES
    return {name: RULES[name] for name in names}


def follow_rules(mode: str) -> dict[str, Rule]:
    """The rules a search in `mode` may apply only after a site's first rewrite, inside its window."""
    return {name: RULES[name] for name in REGROUP_FOLLOW} if mode == "regroup" else {}


@dataclass
class Applied:
    """One rewrite the search kept (a step of a sequence; `gain_s` is the whole sequence's)."""

    rule: str
    roots: list[str]
    gain_s: float
    window_nodes: int

    def to_json(self) -> dict:
        return {"rule": self.rule, "roots": self.roots, "gain_s": self.gain_s, "window_nodes": self.window_nodes}


@dataclass
class SearchResult:
    graph: Graph
    applied: list[Applied] = field(default_factory=list)
    sites: int = 0  # matches tried as the start of a sequence
    evaluated: int = 0  # windows orchestrated (cache misses)
    cached: int = 0  # windows whose cost came from the cache
    seconds: float = 0.0
    ordering_s: float = 0.0  # of `seconds`, spent ordering sites by the model's estimates
    stopped: str = ""  # why the search stopped early, if it did
    saved_s: float = 0.0  # the kept sequences' window savings, added up: what the rewrites promise the plan
    # Measured compiles: the whole tuned plan with and without the applied rewrites (seconds), and
    # whether they were kept (`compiler.compile_model`); None where no such comparison ran.
    plan_s: tuple[float, float] | None = None
    kept: bool = True
    guard_s: float = 0.0  # wall seconds of the plan with them (with `seconds`: what the rewrites add to a compile)
    replanned: bool = False  # a measured compile planned again with them (the windows promised enough)

    def summary(self) -> dict:
        return {"applied": [a.to_json() for a in self.applied], "sites": self.sites, "evaluated": self.evaluated,
                "cached": self.cached, "seconds": round(self.seconds, 2), "ordering_s": round(self.ordering_s, 2),
                "stopped": self.stopped, "saved_us": round(self.saved_s * 1e6, 2), "replanned": self.replanned,
                "kept": self.kept, "guard_s": round(self.guard_s, 2),
                "plan_us": None if self.plan_s is None else [round(x * 1e6, 2) for x in self.plan_s]}


def search(graph: Graph, evaluate: Callable[[Graph], float], rules: Mapping[str, Rule] | None = None,
           depth: int = 3, radius: int = 2, beam: int = 3, max_variants: int = 16,
           budget_s: float = 60.0, estimate: Callable[[Graph], float] | None = None,
           confirm: int = 2, slack: float = 0.25, gain: float = GAIN,
           follow: Mapping[str, Rule] | None = None) -> SearchResult:
    """`graph` with the rewrites that lower `evaluate`'s cost of their windows, and what was tried.
    `follow`: rules a sequence may take after its first step, which open no site themselves.

    With `estimate` (a cheap model beside a measured `evaluate`), the beam runs on estimates and
    only the window and its `confirm` best sequences, those estimated within `slack` of the
    window, are evaluated: ranked by the model, confirmed by measurement, as template schedules
    are (a model that misjudges a shape still gets its best guesses measured). A sequence must save
    `gain` of its window's cost (`MEASURED_GAIN` where `evaluate` measures: noise is not a saving)."""
    rules = RULES if rules is None else rules
    steps_rules = {**rules, **(follow or {})}  # what a sequence may apply after its site's rewrite
    start = time.perf_counter()
    result = SearchResult(graph)
    costs: dict[tuple[str, bool], float] = {}
    spent = False  # once the budget is spent, a site goes on only where every price it needs is known

    def priced(fn: Callable[[Graph], float] | None, precise: bool) -> Callable[[Graph], float]:
        """`fn` through the cache; with no `fn` (or the budget spent), only prices already made."""
        def price(window: Graph) -> float:
            nonlocal spent
            key = (signature(window), precise)
            if key in costs:
                result.cached += 1
            else:
                if precise and not spent and time.perf_counter() - start > budget_s:
                    # Also inside a site: its windows are measured one after another (seconds
                    # each), so checking between sites alone let a search run a site's worth past
                    # its budget. Now it overruns by one window at most.
                    spent, result.stopped = True, f"the {budget_s:.0f} s budget was spent"
                if spent or fn is None:
                    raise _Unpriced
                costs[key] = fn(window)
                result.evaluated += precise
            return costs[key]
        return price

    cost = priced(evaluate, True)
    rough = priced(estimate, False) if estimate is not None else None

    known = priced(None, False)  # an estimate already made, else none
    estimates: dict[tuple[str, str], float] = {}  # a site's last estimated saving (`_by_estimate`)

    tried: set[tuple[str, str]] = set()
    # Nodes a kept sequence matched or made. No later rewrite touches them: window costs are local,
    # so without this two windows could each price the other's undoing as a saving and loop forever
    # (matmul_transposed and transpose_of_transpose did, with measured costs). Every kept sequence
    # settles at least one node of the original graph, so the search ends.
    settled: set[str] = set()
    g = graph
    pending: list[Match] | None = None
    while True:
        if pending is None:  # the matches of the graph as it is now
            pending = find(g, rules)
            if rough is not None and not spent:  # measurements are dear: the sites the model favours first
                # Half the budget at most, so measurements get the rest (bert_base on the H100: the
                # pass took most of 60 s, and the one window measured after it was layer 0's).
                t0 = time.perf_counter()
                pending = _by_estimate(g, pending, rules, rough, radius, settled, start + budget_s / 2, known,
                                       estimates)
                result.ordering_s += time.perf_counter() - t0
        site = next((m for m in pending if (m.rule, m.roots[0]) not in tried and not settled & set(m.nodes)), None)
        if site is None:
            break
        if not spent and time.perf_counter() - start > budget_s:
            # The layers of a transformer repeat one window: the sites left whose windows were
            # already priced (an earlier layer's) still go on, at no cost.
            result.stopped = f"the {budget_s:.0f} s budget was spent"
            spent = True
        tried.add((site.rule, site.roots[0]))
        try:
            steps, saved, size = _best_sequence(g, site, steps_rules, cost, depth, radius, beam, max_variants,
                                                settled, rough, confirm, slack, gain)
        except _Unpriced:
            continue
        result.sites += 1
        if not steps:
            continue
        before = {n.name for n in g.nodes}
        try:
            g = replay(g, [{"rule": r, "roots": list(m.roots)} for r, m in steps], steps_rules)
        except ValueError:  # a step named a node the window created under another name: skip the site
            continue
        settled |= {n.name for n in g.nodes} - before
        settled |= {name for _, m in steps for name in m.nodes}
        result.applied += [Applied(r, list(m.roots), saved, size) for r, m in steps]
        result.saved_s += saved
        pending = None
        logger.debug("rewrite: %s at %s saves %.2f us", " + ".join(r for r, _ in steps), site.roots[0], saved * 1e6)
    result.graph = g
    result.seconds = time.perf_counter() - start
    return result


class _Unpriced(Exception):
    """A window's price is not known and the budget is spent."""


def _by_estimate(g: Graph, sites: list[Match], rules: Mapping[str, Rule], rough: Callable[[Graph], float],
                 radius: int, settled: set[str], deadline: float, known: Callable[[Graph], float] | None = None,
                 memo: dict[tuple[str, str], float] | None = None) -> list[Match]:
    """`sites` ordered so that a budget spent on measuring windows goes to the rewrites the model
    expects to pay most (a transformer's QKV merge before its constant folds). Sites whose windows
    have one structure (the same rule at the same place of the same window: one per transformer
    layer) form a group that one measurement prices. Groups are estimated largest first, one
    member each, until `deadline` (the model's price of a window is most of the cost: bert_base's
    258 sites form about 40 groups), and go by the estimated saving of the first step times their
    size, so eleven layers that share a window come before a first layer whose window differs
    (where the embedding's normalization enters it). After the deadline only windows already estimated
    (`known`; the search orders sites again after each rewrite it keeps) are, and a group not
    estimated keeps its sites' last estimates (`memo`, by rule and root); groups never estimated go
    last. Ties keep node order."""
    memo = {} if memo is None else memo
    reserved = set(g.types) | {n.name for n in g.nodes}
    groups: dict[tuple[str, str, int], list[int]] = {}
    windows: dict[tuple[str, str, int], Graph] = {}
    for k, site in enumerate(sites):
        if settled & set(site.nodes):
            continue
        window = window_graph(g, neighbourhood(g, set(site.nodes), radius))
        place = next(i for i, n in enumerate(window.nodes) if n.name == site.roots[0])
        key = (site.rule, signature(window), place)
        groups.setdefault(key, []).append(k)
        windows.setdefault(key, window)
    total: dict[tuple[str, str, int], float] = {}
    for key in sorted(groups, key=lambda key: (-len(groups[key]), groups[key][0])):
        price = known if time.perf_counter() > deadline else rough
        if price is None:
            break
        window, site = windows[key], sites[groups[key][0]]
        view = View(window)
        m = rules[site.rule].match(view, view.nodes[site.roots[0]])
        if m is None:
            continue
        try:
            base = price(window)
            saving = (base - price(apply(window, rules[m.rule], m, reserved))) / max(base, 1e-12)
        except (NotApplicable, _Unpriced):
            continue
        total[key] = saving * len(groups[key])
        memo.update(((sites[k].rule, sites[k].roots[0]), saving) for k in groups[key])
    for key, ks in groups.items():
        # Not estimated this time: the sites' last estimates stand. A rewrite kept in a transformer's
        # first layer can change the other layers' windows (a free node they share), and they would
        # otherwise go last, unestimated.
        if key not in total and all((sites[k].rule, sites[k].roots[0]) in memo for k in ks):
            total[key] = sum(memo[(sites[k].rule, sites[k].roots[0])] for k in ks)
    group_of = {k: key for key, ks in groups.items() for k in ks}

    def order(k: int) -> tuple[float, int, int]:
        key = group_of.get(k)
        if key is None or key not in total:
            return (float("inf"), k, k)
        return (-total[key], groups[key][0], k)

    return [sites[k] for k in sorted(range(len(sites)), key=order)]


def _best_sequence(g: Graph, site: Match, rules: Mapping[str, Rule], precise: Callable[[Graph], float],
                   depth: int, radius: int, beam: int, max_variants: int, settled: set[str],
                   rough: Callable[[Graph], float] | None = None, confirm: int = 2, slack: float = 0.25,
                   gain: float = GAIN) -> tuple[list[tuple[str, Match]], float, int]:
    """The cheapest sequence of rewrites that starts with `site` and stays inside its window, away
    from `settled` nodes: (its steps, the window's saving, the window's size); no steps if nothing
    beats the window. With `rough`, the beam runs on it and `precise` prices only the window and
    the `confirm` best sequences within `slack` of it."""
    cost = rough or precise
    window = window_graph(g, neighbourhood(g, set(site.nodes), radius))
    reserved = set(g.types) | {n.name for n in g.nodes}  # new names as the whole graph would give them
    base = cost(window)
    tried: list[tuple[float, int, Graph, list[tuple[str, Match]]]] = []
    best: tuple[float, int, list[tuple[str, Match]]] = (base, len(window.nodes), [])
    frontier: list[tuple[Graph, list[tuple[str, Match]]]] = [(window, [])]
    variants = 0
    for level in range(depth):
        grown = []
        for gv, seq in frontier:
            view = View(gv)
            if level == 0:  # the site itself, its precondition checked inside the window
                anchor = view.nodes[site.roots[0]]
                options = [m for m in [rules[site.rule].match(view, anchor)] if m is not None]
            else:
                options = [m for m in find(gv, rules, view) if not settled & set(m.nodes)]
            for m in options:
                if variants >= max_variants:
                    break
                try:
                    g2 = apply(gv, rules[m.rule], m, reserved)
                except NotApplicable:
                    continue
                variants += 1
                grown.append((cost(g2), len(g2.nodes), g2, seq + [(m.rule, m)]))
        if not grown:
            break
        grown.sort(key=lambda x: (x[0], x[1]))
        tried += grown
        for c, nodes, _, seq in grown:
            if _better(c, nodes, best[0], best[1], base, gain):
                best = (c, nodes, seq)
        frontier = [(g2, seq) for _, _, g2, seq in grown[:beam]]
    if rough is not None:  # confirm: the window and the best estimates within the slack, priced precisely
        tried.sort(key=lambda x: (x[0], x[1]))
        hopeful = [x for x in tried if x[0] <= base * (1 + slack)][:confirm]
        if not hopeful:
            return [], 0.0, len(window.nodes)
        c, nodes, _, seq = hopeful[0]
        if abs(c - base) <= TIE * base and nodes < len(window.nodes) and best[2] == seq:
            # The model prices its pick the same with fewer nodes (a constant folded, two reshapes
            # made one): a measurement would tell apart only noise (MEASURED_GAIN), at seconds a window.
            return seq, 0.0, len(window.nodes)
        estimated_base = base
        base = precise(window)
        best = (base, len(window.nodes), [])
        for est, nodes, g2, seq in hopeful:
            c = precise(g2)
            logger.debug("rewrite window at %s: %s estimated %.2f us (window %.2f), measured %.2f us (window %.2f)",
                         site.roots[0], " + ".join(r for r, _ in seq), est * 1e6, estimated_base * 1e6, c * 1e6,
                         base * 1e6)
            if _better(c, nodes, best[0], best[1], base, gain):
                best = (c, nodes, seq)
    c, _, seq = best
    return (seq, base - c, len(window.nodes)) if seq else ([], 0.0, len(window.nodes))


def _better(c: float, nodes: int, best_c: float, best_nodes: int, base: float, gain: float = GAIN) -> bool:
    """Is a variant of cost `c` better than the best so far? It must save `gain` of the window's
    cost `base`, or tie within TIE with fewer nodes."""
    if c < best_c - gain * base:
        return True
    return abs(c - best_c) <= TIE * base and nodes < best_nodes


# ---- windows -----------------------------------------------------------------------------------------

def neighbourhood(g: Graph, seed: set[str], radius: int) -> set[str]:
    """Node names within `radius` hops of `seed` (through tensors, either way), with the free nodes
    (reading only constants and other free nodes) that any of them reads."""
    view = View(g)
    window = set(seed)
    ring = set(seed)
    for _ in range(radius):
        nxt: set[str] = set()
        for name in ring:
            node = view.nodes[name]
            nxt.update(p.name for t in node.inputs if t and (p := view.producers.get(t)) is not None)
            for o in node.outputs:
                nxt.update(c.name for c in view.consumers.get(o, []))
        ring = nxt - window
        window |= nxt
    todo = [t for name in window for t in view.nodes[name].inputs if t]
    free = _free_nodes(g)
    while todo:
        p = view.producers.get(todo.pop())
        if p is not None and p.name in free and p.name not in window:
            window.add(p.name)
            todo.extend(t for t in p.inputs if t)
    return window


def _free_nodes(g: Graph) -> set[str]:
    known = set(g.constants)
    free = set()
    for n in g.nodes:  # topologically sorted
        if n.is_prim and Prim(n.op).category not in (Category.LINEAR, Category.OPAQUE) \
                and all(i in known for i in n.inputs if i) and not any(o in g.outputs for o in n.outputs):
            free.add(n.name)
            known.update(n.outputs)
    return free


def window_graph(g: Graph, names: set[str]) -> Graph:
    """The nodes `names` of `g` as a graph of their own: what they read from outside becomes its
    inputs, what outside (or the graph's outputs) reads becomes its outputs."""
    nodes = [n for n in g.nodes if n.name in names]
    made = {o for n in nodes for o in n.outputs if o}
    inputs: dict[str, None] = {}
    for n in nodes:
        inputs.update((t, None) for t in n.inputs if t and t not in made and t not in g.constants)
    outside = {t for n in g.nodes if n.name not in names for t in n.inputs if t}
    outputs = [t for n in nodes for t in n.outputs if t and (t in outside or t in g.outputs)]
    read = {t for n in nodes for t in n.inputs if t}
    return Graph(f"{g.name}/window", GraphKind.PRIMITIVE, list(inputs), outputs, nodes,
                 {t: g.types[t] for t in (*inputs, *made, *(c for c in read if c in g.constants))},
                 {c: g.constants[c] for c in read if c in g.constants}, dict(g.opsets),
                 wide_constants=g.wide_constants & read)


def signature(g: Graph) -> str:
    """A hash of a graph's structure with its tensor names replaced by their order of appearance:
    two windows of the same shape (one per transformer layer) share it. Constants enter by type,
    and small ones by their values too."""
    ids: dict[str, str] = {t: f"i{k}" for k, t in enumerate(g.inputs)}
    h = hashlib.sha256()

    def ref(t: str) -> str:
        if t in ids:
            return ids[t]
        if t in g.constants:
            # A small constant (a scale, a fill, a shape) may change the code a window compiles to;
            # a weight's values never change its cost, and leaving them out makes the windows of a
            # transformer's layers one signature (one measurement, not one per layer).
            v = np.asarray(g.constants[t]).reshape(-1)
            value = hashlib.sha256(v.tobytes()).hexdigest()[:12] if v.size <= SMALL_CONSTANT else "weight"
            ids[t] = f"c{len(ids)}:{g.types[t]}:{value}"
            h.update(ids[t].encode())
            return ids[t]
        return t  # not reached: a window's tensors are inputs, constants or made before use

    for n in g.nodes:
        ins = ",".join(ref(t) if t else "" for t in n.inputs)
        for o in n.outputs:
            ids[o] = f"t{len(ids)}"
        h.update(f"{n.op}({ins})->{','.join(ids.get(o, '') for o in n.outputs)}:"
                 f"{sorted((k, repr(v)) for k, v in n.attrs.items())}:"
                 f"{[str(g.types[o]) for o in n.outputs if o]}".encode())
    h.update(",".join(ids[o] for o in g.outputs).encode())
    h.update(",".join(str(g.types[i]) for i in g.inputs).encode())
    return h.hexdigest()


def replay(graph: Graph, applied: list[Mapping], rules: Mapping[str, Rule] | None = None) -> Graph:
    """Apply recorded rewrites (`Applied.to_json`) again, in order: an artifact's graph rebuilt.
    Raises KeyError or ValueError naming the step that no longer matches."""
    rules = RULES if rules is None else rules
    g = graph
    for step in applied:
        rule = rules.get(step["rule"])
        if rule is None:
            raise KeyError(f"the rewrite {step['rule']!r} is not one this tessera has")
        view = View(g)
        anchor = view.nodes.get(step["roots"][0])
        m = rule.match(view, anchor) if anchor is not None else None
        if m is None or list(m.roots) != list(step["roots"]):
            raise ValueError(f"the rewrite {step['rule']} no longer matches at node {step['roots'][0]!r}")
        g = apply(g, rule, m)
    return g
