"""GEMM-chain kernels (codegen/chain.py), the deferred-normalization rule and the chain search.

Every kernel runs in Triton's interpreter on the CPU (on the GPU where one is visible) and is
compared with float64 (the reference interpreter) or onnxruntime, on fresh random inputs.
"""
from __future__ import annotations

import numpy as np
import pytest
from kernelcheck import DEVICE
from onnx import helper
from opcheck import Const, graph_model, models_dir, rand
from test_gemm_template import run_exe, run_template, template_launch

import tessera
from tessera.codegen.chain import chain_problem, chain_schedules
from tessera.codegen.kernels import ChainSchedule, schedule_from_json
from tessera.codegen.select import TritonLegality, implement, prologue_of
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model
from tessera.cost.chain_search import chain_search, evolve, parse_chain_key
from tessera.cost.measured import _schedule_key
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.orchestrate import build_ograph
from tessera.orchestrate.candidates import (CandidateRules, enumerate_candidates, layout_prologue,
                                            pointwise_epilogue)
from tessera.orchestrate.graphview import bits
from tessera.rewrite import convert_precision
from tessera.rewrite.deferred import defer_normalization
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import random_inputs, run_onnxruntime

FORCE = CompileOptions(cost="analytical", templates="force")


def attention(m: int, l: int, d: int, heads: int = 2, kv_heads: int | None = None, mask: str = "",
              dv: int | None = None, seed: int = 0, repeat: bool = False, nan_guard: bool = False):
    """softmax(q k^T * scale [+ mask]) v as ONNX: q [1, H, M, D], k [1, Hkv, L, D], v [1, Hkv, L, Dv];
    Hkv < H (dividing H) shares each K/V head among G = H / Hkv query heads (GQA). MatMul broadcasts
    them: k against q directly when Hkv = 1, else against q grouped as [1, Hkv, G, M, D] with k and v
    unsqueezed to [1, Hkv, 1, L, D] (the result reshaped back to [1, H, M, Dv]); or, with `repeat`,
    k and v are repeated to H heads first (Unsqueeze, Expand, Reshape: repeat_kv as exported
    Llama-style models spell it). mask: "causal" (-inf above the diagonal, through Where),
    "additive" (a constant [M, L] added), or none. `nan_guard`: the probabilities pass through
    Where(IsNaN(p), 0, p), as torch exports scaled_dot_product_attention (GPT-2)."""
    kv = kv_heads or heads
    dv = dv or d
    assert heads % kv == 0
    q, k, v = rand(1, heads, m, d, seed=seed), rand(1, kv, l, d, seed=seed + 1), rand(1, kv, l, dv, seed=seed + 2)
    inits: dict = {"q": q, "k": k, "v": v, "scale": Const(np.array(1 / np.sqrt(d), np.float32))}
    nodes, qn, kn, vn, out = [], "q", "k", "v", "out"
    grouped = 1 < kv < heads and not repeat
    if kv < heads and repeat:
        inits.update({"axis2": Const(np.array([2], np.int64)),
                      "kv_rep": Const(np.array([1, kv, heads // kv, l, 1], np.int64)),
                      "k_heads": Const(np.array([1, heads, l, d], np.int64)),
                      "v_heads": Const(np.array([1, heads, l, dv], np.int64))})
        for x in "kv":
            nodes += [helper.make_node("Unsqueeze", [x, "axis2"], [f"{x}5"]),
                      helper.make_node("Expand", [f"{x}5", "kv_rep"], [f"{x}_rep"]),
                      helper.make_node("Reshape", [f"{x}_rep", f"{x}_heads"], [f"{x}_all"])]
        kn, vn = "k_all", "v_all"
    elif grouped:
        inits.update({"axis2": Const(np.array([2], np.int64)),
                      "q_groups": Const(np.array([1, kv, heads // kv, m, d], np.int64)),
                      "o_heads": Const(np.array([1, heads, m, dv], np.int64))})
        nodes += [helper.make_node("Reshape", ["q", "q_groups"], ["q5"]),
                  helper.make_node("Unsqueeze", ["k", "axis2"], ["k5"]), helper.make_node("Unsqueeze", ["v", "axis2"], ["v5"])]
        qn, kn, vn, out = "q5", "k5", "v5", "out5"
    perm = [0, 1, 2, 4, 3] if grouped else [0, 1, 3, 2]
    nodes += [helper.make_node("Transpose", [kn], ["kt"], perm=perm),
              helper.make_node("MatMul", [qn, "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"])]
    logits = "ss"
    if mask == "causal":
        keep = np.tril(np.ones((m, l), bool), k=l - m)
        inits.update({"keep": Const(keep), "ninf": Const(np.array(-np.inf, np.float32))})
        nodes.append(helper.make_node("Where", ["keep", "ss", "ninf"], ["sm"]))
        logits = "sm"
    elif mask == "additive":
        inits["bias"] = Const(rand(m, l, seed=seed + 3, lo=-4, hi=0))
        nodes.append(helper.make_node("Add", ["ss", "bias"], ["sm"]))
        logits = "sm"
    nodes.append(helper.make_node("Softmax", [logits], ["p"], axis=-1))
    probs = "p"
    if nan_guard:
        inits["zero"] = Const(np.array(0.0, np.float32))
        nodes += [helper.make_node("IsNaN", ["p"], ["p_nan"]),
                  helper.make_node("Where", ["p_nan", "zero", "p"], ["pg"])]
        probs = "pg"
    nodes.append(helper.make_node("MatMul", [probs, vn], [out]))
    if grouped:
        nodes.append(helper.make_node("Reshape", [out, "o_heads"], ["out"]))
    return graph_model(nodes, inits, ["out"]), {"q": q, "k": k, "v": v}


def mlp(m: int, k: int, l: int, n: int, act: str = "Relu", seed: int = 0):
    """act(x @ w1 + b1) @ w2 + b2: an MLP (a 1x1-conv pair in matrix form)."""
    x = rand(m, k, seed=seed)
    inits = {"x": x, "w1": Const(rand(k, l, seed=seed + 1, lo=-0.3, hi=0.3)), "b1": Const(rand(l, seed=seed + 2)),
             "w2": Const(rand(l, n, seed=seed + 3, lo=-0.3, hi=0.3)), "b2": Const(rand(n, seed=seed + 4))}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node(act, ["hb"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["y"]),
             helper.make_node("Add", ["y", "b2"], ["out"])]
    return graph_model(nodes, inits, ["out"]), {"x": x}


def whole_kernel(model, precision: str = "fp32", defer: bool = True):
    """The model's primitive graph (as a compile with chains builds it) and all of it as one kernel:
    (graph in the precision, float32 graph, prims + free prologue, outputs)."""
    g32 = fission(load(model).graph).graph
    if defer:
        g32 = defer_normalization(g32)[0]
    g = convert_precision(g32, precision, "precision")
    og = build_ograph(g)
    prims = list(og.nodes)
    return g, g32, prologue_of(og, prims) + prims, list(g.outputs)


def check_chain(model, feeds, schedule: ChainSchedule | None = None, precision: str = "fp32", defer: bool = True):
    """The whole model as one chain kernel (by default its best-ranked schedule) against float64."""
    g, g32, nodes, outputs = whole_kernel(model, precision, defer)
    if schedule is None:
        schedule = chain_search(g, nodes, outputs, precision).ranked[0]
    ks = implement(g, [n for n in nodes], [], outputs, "k_chain", ("Attention",), schedule, precision).triton
    assert ks is not None and "GEMM-chain template" in ks.source
    narrow = {"fp16": np.float16}.get(precision)
    env = {**g.constants, **{k: v.astype(narrow) if narrow else v for k, v in feeds.items()}}
    got = run_template(g, ks, env)
    ref = interp.run(g32, feeds, exact=True)
    err = max(rel_l2(got[o], ref[o]) for o in outputs)
    assert err < TOLERANCE[precision], f"rel L2 {err} under {schedule}\n{ks.source}"
    return ks


# ---- the rewrite -------------------------------------------------------------------------------
def test_deferred_normalization_keeps_the_values():
    for model, feeds in (attention(13, 31, 16, mask="causal"), attention(8, 17, 16, mask="additive"),
                         attention(13, 31, 16, heads=4, kv_heads=1, mask="causal"),  # through row regroupings
                         attention(5, 9, 16, heads=6, kv_heads=2, mask="additive")):
        g = fission(load(model).graph).graph
        moved, n = defer_normalization(g)
        assert n == 1 and not g.same_as(moved)
        div = [x for x in moved.nodes if x.name.endswith("/deferred_div")]
        assert len(div) == 1 and moved.types[div[0].outputs[0]].shape == g.types[div[0].outputs[0]].shape
        assert moved.producers()[div[0].inputs[0]].op == "matmul"  # the product of the undivided values
        a, b = interp.run(g, feeds, exact=True)["out"], interp.run(moved, feeds, exact=True)["out"]
        assert rel_l2(b, a) < 1e-12
    m, _ = mlp(8, 8, 8, 8)  # no normalized operand: nothing to move
    g = fission(load(m).graph).graph
    assert defer_normalization(g) == (g, 0)


def test_deferred_normalization_moves_through_row_regroupings():
    # One right operand for 4 heads: fission folds them into M ([52, 16] @ [16, 31]), the division by a
    # factor per row of one head ([1, 1, 13, 1]) runs on [1, 4, 13, 31], and its result is reshaped back.
    q, k, v = rand(1, 4, 13, 16, seed=1), rand(1, 1, 16, 31, seed=2), rand(1, 1, 31, 8, seed=3)
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Exp", ["s"], ["e"]),
             helper.make_node("Div", ["e", "c"], ["p"]), helper.make_node("MatMul", ["p", "v"], ["out"])]
    model = graph_model(nodes, {"q": q, "k": k, "v": v, "c": Const(rand(1, 1, 13, 1, seed=4, lo=1, hi=2))}, ["out"])
    g = fission(load(model).graph).graph
    moved, n = defer_normalization(g)
    assert n == 1
    (div,) = [x for x in moved.nodes if x.name.endswith("/deferred_div")]
    assert moved.types[div.outputs[0]].shape == (52, 8)  # the [H*M, N] product, divided
    feeds = {"q": q, "k": k, "v": v}
    assert rel_l2(interp.run(moved, feeds, exact=True)["out"], interp.run(g, feeds, exact=True)["out"]) < 1e-12


@pytest.mark.parametrize("m,l", [(13, 31), (13, 9)])  # (13, 9): the first rows fully masked
def test_deferred_normalization_moves_past_the_nan_guard(m, l):
    # torch exports SDPA's softmax as where(isnan(p), 0, p): a fully masked row gives zeros, not NaN.
    model, feeds = attention(m, l, 16, mask="causal", nan_guard=True, seed=3)
    g = fission(load(model).graph).graph
    moved, n = defer_normalization(g)
    assert n == 1 and any(x.name.endswith("/guarded") for x in moved.nodes)
    assert moved.producers()["out/undivided"].inputs[0].endswith("/nan_zeroed")  # the product reads the guarded E
    a, b = interp.run(g, feeds, exact=True)["out"], interp.run(moved, feeds, exact=True)["out"]
    masked = (m - l) * 2 if m > l else 0  # rows of both heads with no key to attend to
    assert not np.isnan(a).any() and (np.abs(a).sum(-1) == 0).sum() == masked
    assert not np.isnan(b).any() and rel_l2(b, a) < 1e-12


def test_the_nan_guard_moves_only_with_a_zero_and_a_softmax():
    # A guard that puts 1, not 0, is not homogeneous; left alone (and so is the division before it).
    model, _ = attention(8, 16, 16, nan_guard=True)
    g = fission(load(model).graph).graph
    (w,) = [x for x in g.nodes if x.op == "where"]
    zero = g.producers()[w.inputs[1]]
    while zero.inputs[0] not in g.constants:
        zero = g.producers()[zero.inputs[0]]
    g.constants[zero.inputs[0]] = np.ones_like(g.constants[zero.inputs[0]])
    assert defer_normalization(g)[1] == 0
    # E / r @ V with the guard, E not an exp: r = 0 would not mean a zero row.
    q, v = rand(1, 6, 7, seed=1), rand(1, 7, 5, seed=2)
    nodes = [helper.make_node("ReduceSum", ["q", "ax"], ["r"], keepdims=1), helper.make_node("Div", ["q", "r"], ["p"]),
             helper.make_node("IsNaN", ["p"], ["pn"]), helper.make_node("Where", ["pn", "zero", "p"], ["pg"]),
             helper.make_node("MatMul", ["pg", "v"], ["out"])]
    model = graph_model(nodes, {"q": q, "v": v, "ax": Const(np.array([-1], np.int64)),
                                "zero": Const(np.array(0.0, np.float32))}, ["out"])
    assert defer_normalization(fission(load(model).graph).graph)[1] == 0


# ---- the generator -----------------------------------------------------------------------------
@pytest.mark.parametrize("m,l,d", [(13, 31, 64), (7, 23, 80), (37, 16, 64)])
def test_attention_odd_and_prime_lengths_head_dims_64_and_80(m, l, d):
    model, feeds = attention(m, l, d, seed=m)
    ks = check_chain(model, feeds)
    assert "alpha" in ks.source and "merged online" in ks.source  # one walk over L


@pytest.mark.parametrize("mask", ["causal", "additive"])
@pytest.mark.parametrize("precision", ["fp16", "tf32"])
def test_masked_attention(mask, precision):
    model, feeds = attention(19, 29, 64, mask=mask, seed=5)
    check_chain(model, feeds, precision=precision)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_nan_guarded_attention_merges_its_max_online(precision):
    model, feeds = attention(13, 9, 64, mask="causal", nan_guard=True, seed=7)  # 4 rows fully masked
    ks = check_chain(model, feeds, precision=precision)
    assert "merged online" in ks.source and ks.source.count("for l") == 1


def fused_qkv_attention(m: int, heads: int, d: int, seed: int = 0):
    """GPT-2's attention as torch exports it: one [1, M, 3*H*D] projection split into q, k and v, each
    reshaped to heads and transposed, a causal mask, a NaN-guarded softmax."""
    x = rand(1, m, 3 * heads * d, seed=seed)
    hd = heads * d
    keep = np.tril(np.ones((m, m), bool))
    inits = {"x": x, "split": Const(np.array([hd] * 3, np.int64)), "heads": Const(np.array([1, m, heads, d], np.int64)),
             "scale": Const(np.array(1 / np.sqrt(d), np.float32)), "keep": Const(keep),
             "ninf": Const(np.array(-np.inf, np.float32)), "zero": Const(np.array(0.0, np.float32))}
    nodes = [helper.make_node("Split", ["x", "split"], ["q0", "k0", "v0"], axis=2)]
    for t in "qkv":
        nodes += [helper.make_node("Reshape", [f"{t}0", "heads"], [f"{t}1"]),
                  helper.make_node("Transpose", [f"{t}1"], [t], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["ss"]),
              helper.make_node("Where", ["keep", "ss", "ninf"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["pn"]),
              helper.make_node("Where", ["pn", "zero", "p"], ["pg"]), helper.make_node("MatMul", ["pg", "v"], ["out"])]
    return graph_model(nodes, inits, ["out"]), {"x": x}


def test_the_head_split_and_the_guard_ride_in_the_chain_past_the_size_cap():
    # The chain's core alone fills the cap; its operands' slices, reshapes and transposes and its
    # epilogue (the deferred division and the NaN guard's rows) come on top.
    model, feeds = fused_qkv_attention(11, 2, 16, seed=4)
    g, _, nodes, outputs = whole_kernel(model)
    og = build_ograph(g)
    split = ("Split_0/", "Reshape_1/", "Transpose_2/", "Reshape_3/", "Transpose_4/", "Reshape_5/", "Transpose_6/")
    epilogue = {"out/row_factor", "out/deferred_div", "out/guard_probe", "out/guard_rows", "out/guard_rows_wide",
                "out/guarded"}
    core = sum(1 << i for i, n in enumerate(og.nodes) if not n.name.startswith(split) and n.name not in epilogue)
    cap = core.bit_count()
    found = enumerate_candidates(og, og.all, CandidateRules(max_nodes=cap, max_linear=2), TritonLegality(chains=True))
    assert og.n > cap + 12 and [c.outputs for c in found if c.nodes == og.all] == [og.sinks(og.all)]
    assert {og.nodes[i].name for i in bits(pointwise_epilogue(og, core, og.all, 16))} == epilogue
    assert layout_prologue(og, core, og.all, 2).bit_count() == 2  # at most the limit, nearest first
    ks = check_chain(model, feeds, precision="fp16")
    assert [t for t in ks.inputs if t not in g.constants] == ["x"]  # q, k and v read in place: no copy
    assert "merged online" in ks.source


@pytest.mark.parametrize("schedule", [ChainSchedule(16, 16, 16, 32, 4, 2),  # deep K, split N, ragged L
                                      ChainSchedule(32, 64, 32, 128, 4, 1)])  # flat K, whole N
def test_schedules_tile_k_n_and_l(schedule):
    model, feeds = attention(21, 45, 80, dv=40, seed=3)
    check_chain(model, feeds, schedule)


def test_without_the_rewrite_the_chain_walks_per_level():
    # softmax's division before the product: the product waits on the row sum, a third walk.
    model, feeds = attention(9, 20, 16, seed=4)
    ks = check_chain(model, feeds, ChainSchedule(16, 16, 16, 16), defer=False)
    assert "merged online" not in ks.source and ks.source.count("for l") == 3


@pytest.mark.parametrize("act", ["Relu", "Gelu"])
def test_gemm_activation_gemm(act):
    model, feeds = mlp(33, 24, 70, 17, act)
    ks = check_chain(model, feeds, precision="tf32")
    assert "middle: " in ks.source and "(add)" in ks.source


def test_plain_gemm_chain_fp16():
    a, b, c = rand(1, 40, 24, seed=1), rand(1, 24, 50, seed=2), rand(1, 50, 30, seed=3)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "c"], ["out"])],
                        {"a": a, "b": b, "c": c}, ["out"])
    check_chain(model, {"a": a, "b": b, "c": c}, ChainSchedule(16, 32, 32, 32, 4, 2), "fp16")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_head_dim_of_80_walked_whole_is_a_64_and_a_16_wide_dot(precision):
    model, feeds = attention(13, 37, 80, mask="causal", seed=5)
    ks = check_chain(model, feeds, ChainSchedule(16, 128, 32, 128, 4, 2), precision)
    assert "tl.arange(0, 64)" in ks.source and "64 + tl.arange(0, 16)" in ks.source
    assert "tl.arange(0, 128)" not in ks.source.split("for l")[0]  # no K lane past 80 in the first product


# Split L: (M, L, block_l, split) with the last slice short (70 = 48 + 22) and exact (64 = 4 x 16).
@pytest.mark.parametrize("m,l,bl,split", [(33, 70, 16, 2), (20, 64, 16, 4)])
@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_split_walks_sum_their_partials_once_per_tile(m, l, bl, split, precision):
    model, feeds = mlp(m, 24, l, 17, "Relu", seed=m)
    ks = check_chain(model, feeds, ChainSchedule(16, 32, bl, 32, 4, 2, split), precision)
    assert f"split over {split} programs" in ks.source and ks.workspace > 0
    assert ks.launches[0].grid[-1] == split
    # The bias and ReLU of the middle ride in each slice's walk; the output bias only in the sum.
    assert ks.source.index("arrived ==") < ks.source.index("tl.store(out")


def test_a_split_chain_runs_again_from_its_reset_counters():
    a, b, c = rand(3, 40, 24, seed=1), rand(3, 24, 50, seed=2), rand(3, 50, 30, seed=3)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "c"], ["out"])],
                        {"a": a, "b": b, "c": c}, ["out"])
    g, g32, nodes, outputs = whole_kernel(model)
    ks = implement(g, nodes, [], outputs, "k_chain", (), ChainSchedule(16, 16, 16, 16, 4, 1, 4)).triton
    kernel, args, outs = template_launch(g, ks, {**g.constants, "a": a, "b": b, "c": c})
    ref = interp.run(g32, {"a": a, "b": b, "c": c}, exact=True)["out"]
    for _ in range(2):  # batch 3: one counter per (batch entry, tile), each back at 0 after a launch
        outs[0].zero_()
        kernel(*args, *outs)
        assert rel_l2(outs[0].cpu().numpy(), ref) < TOLERANCE["fp32"]
    assert not kernel.workspace[-ks.launches[0].grid[0] * 3:].any()


def test_split_needs_a_middle_without_row_reductions():
    model, feeds = attention(13, 64, 16)
    g, _, nodes, outputs = whole_kernel(model)
    assert all(s.split_l == 1 for s in chain_schedules(chain_problem(g, nodes), 4).kept)
    with pytest.raises(Unsupported, match="row reduction"):
        implement(g, nodes, [], outputs, "k", (), ChainSchedule(16, 16, 16, 16, 4, 1, 2))
    model, _ = mlp(64, 32, 100, 64)
    g, _, nodes, outputs = whole_kernel(model)
    kept = chain_schedules(chain_problem(g, nodes), 4).kept
    # Splits of whole blocks that cover L = 100 (7 steps of 16) exactly: 2 (4 + 3 steps) or 4 ways
    # (2 + 2 + 2 + 1), not 8 (7 slices of one step: the same as 7) or 16.
    assert {s.split_l for s in kept if s.block_l == 16} == {1, 2, 4}


def test_the_first_measured_alternate_whole_and_split_walks():
    model, _ = mlp(512, 128, 512, 128)
    g, _, nodes, outputs = whole_kernel(model, "fp16")
    first = chain_search(g, nodes, outputs, "fp16").ranked[:4]
    assert [s.split_l > 1 for s in first] == [False, True, False, True]


def test_no_chain_form_is_refused_with_the_reason():
    # A middle value read outside the chain (the probabilities as a second output) has no chain form.
    q, k, v = rand(1, 4, 8, seed=1), rand(1, 8, 6, seed=2), rand(1, 6, 5, seed=3)
    model = graph_model([helper.make_node("MatMul", ["q", "k"], ["s"]), helper.make_node("Relu", ["s"], ["p"]),
                         helper.make_node("MatMul", ["p", "v"], ["out"])], {"q": q, "k": k, "v": v}, ["out", "p"])
    g, _, nodes, outputs = whole_kernel(model)
    with pytest.raises(Unsupported, match="not computed from the second matmul"):
        implement(g, nodes, [], outputs, "k", (), ChainSchedule(16, 16, 16, 16))
    with pytest.raises(Unsupported, match="only as a GEMM-chain template"):
        implement(g, nodes, [], outputs, "k")


# Grouped-query attention at 4 heads: (K/V heads, repeated by Expand first). MatMul's broadcast of one
# K/V head folds the heads into M (a [4*M, D] @ [D, L] chain, the softmax on row views of it); of two,
# it is a BROADCAST of K/V along the batch in the operands' prologue, as is repeat_kv's Expand.
GQA = pytest.mark.parametrize("kv_heads,repeat", [(2, False), (1, False), (2, True)],
                              ids=["grouped", "multi-query", "repeat_kv"])


@GQA
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gqa_attention_reads_shared_kv_in_place(kv_heads, repeat, precision):
    model, feeds = attention(13, 31, 64, heads=4, kv_heads=kv_heads, seed=7, repeat=repeat)
    ks = check_chain(model, feeds, precision=precision)
    assert "merged online" in ks.source  # one walk over L
    # The kernel reads q, k and v as stored (k and v [1, Hkv, L, D]), nothing repeated to 4 heads.
    assert set(ks.inputs) == {"q", "k", "v", "scale"}
    if kv_heads > 1:  # query head b reads K/V head b // 2 in place
        assert "pid_b // 2" in ks.source
    else:  # one K/V head for all: the heads are rows of one [4*13, 64] @ [64, 31] chain
        assert "batch 1 x M 52" in ks.source


@GQA
def test_masked_gqa_attention(kv_heads, repeat):
    model, feeds = attention(11, 37, 64, heads=4, kv_heads=kv_heads, mask="causal", seed=8, repeat=repeat)
    check_chain(model, feeds, ChainSchedule(16, 64, 16, 32, 4, 1))  # deep K, ragged M and L


# ---- the search --------------------------------------------------------------------------------
def test_schedules_triton_miscompiles_are_never_in_the_space():
    # GPT-2's attention (M 128, K 64, L 128, N 64, fp16), whose plan faulted on the H200 with a 32-column
    # output block at 4 warps (session 26); that family (a wgmma of N = 32 per warp group) is out at
    # every stage count, and the same tile at 8 warps or 64 columns wide stays.
    from tessera.codegen.chain import known_fault

    model, _ = attention(128, 128, 64, heads=2, mask="causal", seed=3)
    g, _, nodes, _ = whole_kernel(model)
    space = chain_schedules(chain_problem(g, nodes), 2)
    kept = {(s.block_m, s.block_n, s.block_l, s.block_k, s.num_warps, s.num_stages) for s in space.kept}
    assert space.rejected["known fault"] > 0
    assert not [s for s in space.kept if known_fault(s.block_m, s.block_n, s.num_warps)]
    for st in (1, 2, 3):
        assert (64, 32, 128, 64, 4, st) not in kept and (128, 32, 128, 64, 8, st) not in kept
    assert {(64, 32, 128, 64, 8, 2), (64, 64, 128, 64, 4, 2), (32, 32, 128, 64, 4, 2)} <= kept


def test_the_space_is_pruned_and_an_intermediate_too_big_is_tiled():
    # N = 512 is never one tile: deep N only; registers reject the widest tiles.
    model, _ = mlp(64, 32, 1000, 512)
    g, _, nodes, outputs = whole_kernel(model)
    cp = chain_problem(g, nodes)
    space = chain_schedules(cp, 4)
    assert len(space.kept) < space.size and space.rejected["registers"] > 0
    assert all(s.block_n < 512 and s.block_l <= 128 for s in space.kept)  # L = 1000 is walked in chunks
    found = chain_search(g, nodes, outputs)
    assert found.pruned == len(space.kept) and 0 < found.generations and len(found.ranked) <= found.pruned
    assert set(found.ranked) <= set(space.kept)


def test_evolution_stops_on_convergence_and_finds_the_optimum():
    space = [ChainSchedule(bm, bn, bl, bk, w, st) for bm in (16, 32, 64, 128) for bn in (32, 64)
             for bl in (16, 32, 64, 128) for bk in (32, 64) for w in (4, 8) for st in (1, 2, 3)]
    target = ChainSchedule(64, 64, 64, 64, 4, 2)

    def fitness(s: ChainSchedule) -> float:  # a smooth bowl around the target
        return sum(abs(np.log2(getattr(s, f) / getattr(target, f))) for f in ("block_m", "block_n", "block_l",
                                                                             "block_k", "num_warps", "num_stages"))

    priced, gens = evolve(space, fitness, seed=1)
    assert min(priced, key=priced.__getitem__) == target
    assert gens < 40 and len(priced) < len(space)  # it converged before pricing everything


def _samples(params):
    """Measured-like samples of three attention chains: the model's own times under `params`."""
    from tessera.cost.chain_search import chain_features, predict_chain
    from tessera.cost.devices import device

    out = []
    for m, l, d in ((64, 128, 64), (256, 512, 64), (128, 256, 32)):
        g, _, nodes, outputs = whole_kernel(attention(m, l, d)[0])
        f = chain_features(g, nodes, outputs, "fp32")
        space = chain_schedules(chain_problem(g, nodes), 4).kept
        out += [(f, s, predict_chain(s, f, device("h100"), params)) for s in space[::7]]
    return out


def test_the_model_refits_its_constants_to_measurements():
    from dataclasses import replace

    from tessera.cost.chain_search import CHAIN_PARAMS, fit_chain_params, model_error
    from tessera.cost.devices import device

    truth = replace(CHAIN_PARAMS, step_s=CHAIN_PARAMS.step_s * 4, launch_s=CHAIN_PARAMS.launch_s / 2, mma_rows=32)
    samples = _samples(truth)
    h100 = device("h100")
    before = model_error(samples, h100, CHAIN_PARAMS)
    fitted = fit_chain_params(samples, h100)
    assert model_error(samples, h100, fitted) < 0.05 * before


def test_rank_error_counts_misordered_pairs_and_the_regret():
    from tessera.cost.chain_search import rank_error

    assert rank_error([1, 2, 3], [10, 20, 30]) == {"discordant_pairs": 0.0, "regret": 1.0}
    e = rank_error([1, 2, 3], [30, 20, 10])  # every pair the wrong way: the model's first is the slowest
    assert e["discordant_pairs"] == 1.0 and e["regret"] == 3.0


def test_measured_chains_refit_the_model_from_the_database(tmp_path):
    from dataclasses import replace

    import tessera.cost.chain_search as cs
    from tessera.cost.chain_search import chain_key, parse_chain_key
    from tessera.cost.db import Key, TuningDB
    from tessera.cost.devices import device

    samples = _samples(replace(cs.CHAIN_PARAMS, load_s=cs.CHAIN_PARAMS.load_s * 3))
    h100 = device("h100")
    with TuningDB(tmp_path / "t.db") as db:
        for i, (f, s, t) in enumerate(samples):
            sig = f"sig{f.m}-{f.l}"
            db.put_features(sig, f.to_json())
            db.put(Key("gpu", "v", sig, chain_key(s)), t)
        db.put(Key("gpu", "v", "sig64-128", "default"), 1e-5)  # a library row: not a chain sample
        rows = cs.db_samples(db.chain_samples("gpu"))
        assert len(rows) == len(samples) and not db.chain_samples("other gpu")
    assert parse_chain_key(chain_key(samples[0][1])) == samples[0][1] and parse_chain_key("default") is None
    assert cs.calibrate_from_db(rows[:3], h100) is None  # too few: the defaults stay
    try:
        fitted = cs.calibrate_from_db(rows, h100)
        assert fitted is not None and cs.params_for(h100) == fitted
        assert cs.model_error([s for _, s in rows], h100, fitted) < cs.model_error([s for _, s in rows], h100,
                                                                                  cs.CHAIN_PARAMS)
    finally:
        cs._CALIBRATED.clear()


def test_schedule_round_trips():
    s = ChainSchedule(32, 64, 128, 64, 8, 3)
    assert schedule_from_json(s.to_json()) == s and _schedule_key(s) == "chain-m32-n64-l128-k64-w8-s3"
    s = ChainSchedule(32, 64, 128, 64, 8, 3, 4)
    assert schedule_from_json(s.to_json()) == s and _schedule_key(s) == "chain-m32-n64-l128-k64-w8-s3-p4"
    assert parse_chain_key(_schedule_key(s)) == s and parse_chain_key("chain-m32-n64-l128-k64-w8-s3-x4") is None


# ---- end to end ----------------------------------------------------------------------------------
def test_forced_compile_runs_attention_as_one_kernel(tmp_path):
    model, feeds = attention(13, 31, 64, heads=2, mask="causal", seed=2)
    result = compile_model(model, FORCE)
    assert len(result.kernels) == 1 and result.rewrites == ["deferred_normalization"]
    (search,) = result.chains.values()
    assert search["after_pruning"] <= search["space"] and search["model_rank_of_run"] == 1
    from tessera.compiler import write_artifacts

    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", DEVICE)  # the loader replays the rewrite
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]


def test_a_saved_plan_with_a_faulting_chain_tile_loads_with_a_warning(tmp_path, caplog):
    # Plans saved before session 62 may hold a tile of `known_fault`'s family: they load and run (on Hopper
    # they may fault now and then), and the loader says which kernels and to compile again.
    import json
    import logging

    from tessera.compiler import write_artifacts
    from tessera.runtime import artifact

    model, feeds = attention(13, 31, 64, heads=2, mask="causal", seed=2)
    art = tmp_path / "art"
    write_artifacts(compile_model(model, FORCE), art)
    with caplog.at_level(logging.WARNING, logger="tessera"):
        tessera.load(art, DEVICE)
    assert "fault" not in caplog.text  # tuned today: no such tile
    plan = json.loads((art / "plan.json").read_text())
    (kernel,) = [k for k in plan["kernels"] if k["schedule"]["form"] == "chain"]
    kernel["schedule"].update(block_m=64, block_n=32, num_warps=4)
    (art / "plan.json").write_text(json.dumps(plan))
    meta = json.loads((art / "artifact.json").read_text())
    meta["files"] = artifact._file_hashes(art)
    meta["seal"] = artifact._seal(meta)
    (art / "artifact.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="tessera"):
        exe = tessera.load(art, "cpu")  # the interpreter runs the tile right; a Hopper GPU may not
    assert kernel["name"] in caplog.text and "fault" in caplog.text and "compile the model again" in caplog.text
    ref = run_onnxruntime(model, feeds)["out"]
    import torch

    got = exe(*[torch.from_numpy(feeds[n]) for n in exe.input_names])[0].numpy()
    assert rel_l2(got, ref) < TOLERANCE["fp32"]


def test_a_cached_plan_with_a_faulting_chain_tile_is_planned_again(tmp_path, monkeypatch, caplog):
    # The plan cache's key names tessera's and the software's versions, which this exclusion did not
    # change: an entry planned before it is stale, removed and planned again, not run.
    import logging

    from tessera.runtime import plan_cache

    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    tile = {"form": "chain", "block_m": 64, "block_n": 32, "block_l": 128, "block_k": 64, "num_warps": 4}
    plan_cache.store("k", {"kernels": [{"name": "k0_chain", "schedule": tile}]}, {})
    with caplog.at_level(logging.INFO, logger="tessera"):
        assert plan_cache.lookup("k", None, "cpu") is None
    assert "k0_chain" in caplog.text and "fault" in caplog.text
    assert not (plan_cache.plan_dir() / "k.json").exists()


@GQA
def test_forced_compile_runs_gqa_attention_as_one_kernel(kv_heads, repeat, tmp_path):
    model, feeds = attention(13, 31, 64, heads=4, kv_heads=kv_heads, mask="causal", seed=6, repeat=repeat)
    result = compile_model(model, FORCE)
    assert result.rewrites == ["deferred_normalization"]
    # One launch: the chain. Any other kernel is a reshape of an input or of the result (a view: no
    # launch, no copy).
    runs = [k for k in result.kernels if k.backend != "view"]
    assert len(runs) == 1 and runs[0].backend == "template" and "GEMM-chain template" in runs[0].triton.source
    # K and V are not copied to 4 heads: the chain reads as many elements as q, k and v hold.
    g = result.graph
    assert sum(g.types[t].numel for t in runs[0].triton.inputs if t not in g.constants) == \
        sum(x.size for x in feeds.values())
    from tessera.compiler import write_artifacts

    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", DEVICE)  # the loader replays the rewrite
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]


def conv_pair(n: int, c: int, h: int, w: int, mid: int, out: int, act: str = "Relu", seed: int = 0):
    """A 3x3 convolution, then a pair of 1x1 convolutions (with biases) joined through `act`, then a
    ReLU: the pair `rewrite/rules/pointwise_conv.py` turns into an MLP over pixel rows."""
    x = rand(n, c, h, w, seed=seed)
    inits = {"x": x, "w0": Const(rand(c, c, 3, 3, seed=seed + 1, lo=-0.3, hi=0.3)),
             "w1": Const(rand(mid, c, 1, 1, seed=seed + 2, lo=-0.3, hi=0.3)), "b1": Const(rand(mid, seed=seed + 3)),
             "w2": Const(rand(out, mid, 1, 1, seed=seed + 4, lo=-0.3, hi=0.3)), "b2": Const(rand(out, seed=seed + 5))}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["x0"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x0", "w1", "b1"], ["h"]), helper.make_node(act, ["h"], ["a"]),
             helper.make_node("Conv", ["a", "w2", "b2"], ["y"]), helper.make_node("Relu", ["y"], ["out"])]
    return graph_model(nodes, inits, ["out"], opset=14), {"x": x}


@pytest.mark.parametrize("act", ["Relu", "HardSwish"])
def test_a_pair_of_1x1_convolutions_runs_as_one_chain(act, tmp_path):
    # Issue 15's 1x1-convolution pairs: with the rewrites on, the pair becomes an MLP over pixel rows
    # whose chain kernel reads the NCHW input in place and stores its result back in NCHW order (a
    # transposed store), so nothing else runs but the 3x3 convolution. HardSwish reads its input twice.
    model, feeds = conv_pair(2, 12, 7, 5, 40, 9, act, seed=3)
    result = compile_model(model, CompileOptions(cost="analytical", templates="force", rewrites="on"))
    assert "conv1x1_pair_as_mlp" in [a["rule"] for a in result.rewrite_search["applied"]]
    runs = [k for k in result.kernels if k.backend != "view"]
    assert len(runs) == 2, [k.name for k in runs]
    chain = next(k for k in runs if "GEMM-chain template" in k.triton.source)
    assert {n.op for n in chain.prims} >= {"transpose", "matmul", "max"}
    from tessera.compiler import write_artifacts

    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", DEVICE)  # the loader replays the rewrite
    ref = run_onnxruntime(model, feeds)["out"]
    assert rel_l2(run_exe(exe, feeds)[0], ref) < TOLERANCE["fp32"]


def test_a_right_grouped_chain_runs_transposed_as_one_chain(tmp_path):
    # (a @ b) @ d regrouped as a @ (b @ d) (fewer multiply-adds) has its intermediate on the right;
    # computed transposed, ((dᵀ bᵀ) aᵀ)ᵀ, it is one chain kernel that reads a, b and d transposed in
    # place and stores its tile transposed. M and N off the tiles (masked), each a multiple of 16 bytes (unpadded).
    a, b, d = rand(1, 516, 96, seed=1), rand(1, 96, 300, seed=2), rand(1, 300, 80, seed=3)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["ab"]), helper.make_node("MatMul", ["ab", "d"], ["out"])],
                        {"a": a, "b": b, "d": d}, ["out"])
    result = compile_model(model, CompileOptions(cost="analytical", templates="force", rewrites="on"))
    assert [x["rule"] for x in result.rewrite_search["applied"]] == ["matmul_associative", "matmul_chain_transposed"]
    runs = [k for k in result.kernels if k.backend != "view"]
    assert len(runs) == 1 and "GEMM-chain template" in runs[0].triton.source
    from tessera.compiler import write_artifacts

    write_artifacts(result, tmp_path / "art")
    exe = tessera.load(tmp_path / "art", DEVICE)
    feeds = {"a": a, "b": b, "d": d}
    assert rel_l2(run_exe(exe, feeds)[0], run_onnxruntime(model, feeds)["out"]) < TOLERANCE["fp32"]


def test_chains_stay_off_unless_templates_are_measured_or_forced():
    model, _ = attention(8, 16, 16)
    assert all(len([n for n in k.prims if n.op == "matmul"]) <= 1
               for k in compile_model(model, CompileOptions(cost="analytical")).kernels)
    assert all(len([n for n in k.prims if n.op == "matmul"]) <= 1
               for k in compile_model(model, CompileOptions(cost="analytical", templates="force", chains=False)).kernels)
    legal = TritonLegality(chains=False)
    g = fission(load(model).graph).graph
    og = build_ograph(g)
    assert legal.check(og, (1 << og.n) - 1) is not None


def test_bert_tiny_forced_runs_its_attention_as_chains():
    path = models_dir() / "bert_tiny.onnx"
    exe = tessera.compile(path, FORCE, DEVICE)
    chains = [s for s in exe.sources().values() if "GEMM-chain template" in s]
    assert len(chains) >= 2  # one per layer's attention at least
    model = load(path)
    feeds = random_inputs(model.graph, seed=5)
    ref = run_onnxruntime(model.model, feeds)
    for name, out in zip(exe.output_names, run_exe(exe, feeds)):
        assert rel_l2(out, ref[name]) < TOLERANCE["fp32"]
