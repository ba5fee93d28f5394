"""Fission rules of ops/linear.py (MatMul, Gemm, Conv, ConvTranspose) against onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator
from opcheck import Const, build_model, check_op, rand

from tessera.errors import ShapeError
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.tolerance import rel_l2


def _ops(pg) -> list[str]:
    return [n.op for n in pg.nodes]


def _check_reference(model, feeds) -> None:
    """Like check_op, with the ONNX reference implementation as the reference."""
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    pg = fission(load(model).graph).graph
    assert all(n.op != "opaque" for n in pg.nodes)
    out = interp.run(pg, feeds)[pg.outputs[0]]
    assert out.shape == ref.shape
    assert rel_l2(out, ref) < 1e-5


def _opaque_reasons(model) -> list[str]:
    return [o.reason for o in fission(load(model).graph).opaque]


# ---- MatMul -------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((7,), (7,)),  # dot product -> scalar
    ((7,), (7, 5)),
    ((3, 7), (7,)),
    ((5, 7), (7, 3)),
    ((1, 1), (1, 1)),
    ((2, 5, 7), (7, 4)),  # batch folded into M
    ((2, 3, 5, 7), (7,)),  # folded, 1-D right operand
    ((1, 1, 5, 7), (7, 4)),
    ((3, 5, 7), (1, 7, 4)),  # right batch is all ones: still folded
    ((5, 7), (1, 1, 7, 4)),  # output gains the right's size-1 batch dims
    ((3, 5, 7), (3, 7, 4)),
    ((2, 3, 5, 7), (2, 3, 7, 4)),
    ((2, 1, 5, 7), (3, 7, 4)),  # both batches broadcast
    ((5, 7), (3, 7, 4)),  # only the right operand has a batch
    ((7,), (2, 7, 4)),
    ((3, 1, 2, 5, 7), (4, 1, 7, 6)),  # 5-D
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("const_b", [False, True], ids=["input", "const"])
def test_matmul(sa, sb, const_b):
    b = rand(*sb, seed=2)
    check_op("MatMul", {"a": rand(*sa, seed=1), "b": Const(b) if const_b else b}, expect_prims=["matmul"])


@pytest.mark.parametrize("sa,sb", [((2, 5, 7), (7, 4)), ((2, 3, 5, 7), (7,)), ((3, 5, 7), (1, 7, 4))])
def test_matmul_fold_has_no_broadcast(sa, sb):
    pg = check_op("MatMul", {"a": rand(*sa, seed=1), "b": Const(rand(*sb, seed=2))})
    ops = _ops(pg)
    assert ops.count("matmul") == 1 and "broadcast" not in ops, ops
    mm = next(n for n in pg.nodes if n.op == "matmul")
    assert len(pg.types[mm.inputs[0]].shape) == 2  # [prod(batch) * M, K]


def test_matmul_broadcast_batches():
    pg = check_op("MatMul", {"a": rand(2, 1, 5, 7, seed=1), "b": rand(3, 7, 4, seed=2)},
                  expect_prims=["matmul", "broadcast"])
    mm = next(n for n in pg.nodes if n.op == "matmul")
    assert pg.types[mm.inputs[0]].shape == (2, 3, 5, 7)
    assert pg.types[mm.inputs[1]].shape == (2, 3, 7, 4)


@pytest.mark.parametrize("opset", [1, 9, 13])
def test_matmul_opsets(opset):
    check_op("MatMul", {"a": rand(2, 5, 7, seed=1), "b": rand(7, 3, seed=2)}, opset=opset)


def test_matmul_large_k():
    # K = 4099 (prime): float32 accumulation error grows like sqrt(K) * 6e-8,
    # far below 1e-5 for random inputs, so the usual bound holds.
    check_op("MatMul", {"a": rand(3, 4099, seed=1), "b": Const(rand(4099, 5, seed=2))})


def test_matmul_int32():
    rng = np.random.default_rng(0)
    a = rng.integers(-9, 10, size=(2, 5, 7)).astype(np.int32)
    b = rng.integers(-9, 10, size=(7, 3)).astype(np.int32)
    check_op("MatMul", {"a": a, "b": b})


# ---- Gemm ---------------------------------------------------------------------------
M, K, N = 5, 7, 3
C_SHAPES = [None, (), (1,), (N,), (1, N), (M, 1), (M, N)]


@pytest.mark.parametrize("c_shape", C_SHAPES, ids=lambda s: "noC" if s is None else "C" + "x".join(map(str, s)))
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 1.0), (1.0, -1.5), (2.5, 0.25)])
@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(c_shape, alpha, beta, trans_a, trans_b):
    a = rand(*((K, M) if trans_a else (M, K)), seed=1)
    b = rand(*((N, K) if trans_b else (K, N)), seed=2)
    inputs = {"a": a, "b": Const(b)}
    if c_shape is not None:
        inputs["c"] = rand(*c_shape, seed=3)
    attrs = {"transA": trans_a, "transB": trans_b, "alpha": alpha, "beta": beta}
    pg = check_op("Gemm", inputs, attrs, opset=13)
    ops = _ops(pg)
    assert ops.count("matmul") == 1
    assert ops.count("transpose") == trans_a + trans_b
    assert ops.count("add") == (c_shape is not None)
    assert ops.count("mul") == (alpha != 1.0) + (beta != 1.0 and c_shape is not None)


def test_gemm_is_matmul_add():
    pg = check_op("Gemm", {"a": rand(M, K, seed=1), "b": Const(rand(K, N, seed=2)), "c": Const(rand(N, seed=3))},
                  expect_prims=["matmul", "add"])
    assert sorted(_ops(pg)) == ["add", "broadcast", "matmul", "reshape"]  # C: [N] -> [1, N] -> [M, N]


def test_gemm_beta_zero_drops_c():
    pg = check_op("Gemm", {"a": rand(M, K, seed=1), "b": rand(K, N, seed=2), "c": rand(M, N, seed=3)},
                  {"beta": 0.0})
    assert _ops(pg) == ["matmul"]


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_gemm_old_opsets(opset):
    check_op("Gemm", {"a": rand(K, M, seed=1), "b": rand(K, N, seed=2), "c": rand(N, seed=3)},
             {"transA": 1, "alpha": 0.75}, opset=opset)


@pytest.mark.parametrize("c_shape,broadcast", [((N,), 1), ((M, N), 0)])
def test_gemm_opset6_broadcast_attr(c_shape, broadcast):
    # onnxruntime has no Gemm before opset 7: the ONNX reference implementation judges.
    feeds = {"a": rand(M, K, seed=1), "b": rand(K, N, seed=2), "c": rand(*c_shape, seed=3)}
    _check_reference(build_model("Gemm", feeds, {"broadcast": broadcast, "alpha": 0.5}, opset=6), feeds)


def test_gemm_opset6_needs_broadcast_attr():
    feeds = {"a": rand(M, K, seed=1), "b": rand(K, N, seed=2), "c": rand(N, seed=3)}
    with pytest.raises(ShapeError, match="broadcast=0"):
        fission(load(build_model("Gemm", feeds, opset=6)).graph)


# ---- Conv ----------------------------------------------------------------------------
CONV_CASES = {
    "2d_pad1": ((2, 3, 9, 11), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_nopad": ((1, 3, 7, 5), (2, 3, 3, 2), {}),
    "1x1": ((2, 5, 6, 7), (3, 5, 1, 1), {}),
    "strided_dilated_asym": ((1, 3, 13, 11), (5, 3, 3, 2), {"strides": [2, 3], "dilations": [2, 1],
                                                             "pads": [0, 1, 2, 1]}),
    "grouped": ((1, 6, 7, 7), (4, 3, 3, 3), {"group": 2, "pads": [1, 0, 1, 2]}),
    "depthwise": ((2, 5, 8, 9), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}),
    "depthwise_mult2": ((1, 5, 8, 9), (10, 1, 3, 3), {"group": 5, "strides": [2, 2]}),
    "kernel_shape_given": ((1, 3, 9, 9), (4, 3, 3, 3), {"kernel_shape": [3, 3], "strides": [2, 1]}),
    "1d": ((2, 3, 13), (5, 3, 4), {"strides": [3], "pads": [2, 1]}),
    "1d_dilated": ((1, 2, 17), (3, 2, 3), {"dilations": [3], "pads": [0, 2]}),
    "3d": ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"strides": [1, 2, 2], "dilations": [2, 1, 1],
                                              "pads": [0, 1, 1, 1, 0, 0]}),
    "3d_grouped": ((1, 4, 5, 5, 5), (6, 2, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1, 1, 1]}),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_conv(case, bias):
    xs, ws, attrs = CONV_CASES[case]
    inputs = {"x": rand(*xs, seed=1), "w": Const(rand(*ws, seed=2))}
    if bias:
        inputs["b"] = Const(rand(ws[0], seed=3))
    pg = check_op("Conv", inputs, attrs, expect_prims=["conv"] + (["add"] if bias else []))
    assert _ops(pg).count("conv") == 1


@pytest.mark.parametrize("auto_pad", ["VALID", "SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("xs,ws,strides", [
    ((1, 3, 9, 10), (4, 3, 4, 3), [2, 3]),  # even kernel: odd total pad
    ((2, 2, 7, 8), (3, 2, 3, 2), [1, 1]),
    ((1, 2, 11), (2, 2, 4), [3]),
    ((1, 2, 4, 5, 6), (2, 2, 2, 3, 2), [2, 1, 3]),
], ids=["2d_s23", "2d_s1", "1d", "3d"])
def test_conv_auto_pad(auto_pad, xs, ws, strides):
    check_op("Conv", {"x": rand(*xs, seed=1), "w": Const(rand(*ws, seed=2)), "b": Const(rand(ws[0], seed=3))},
             {"auto_pad": auto_pad, "strides": strides})


@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_opsets(opset):
    check_op("Conv", {"x": rand(1, 4, 8, 9, seed=1), "w": rand(6, 2, 3, 3, seed=2), "b": rand(6, seed=3)},
             {"group": 2, "auto_pad": "SAME_UPPER", "strides": [2, 2]}, opset=opset)


def test_conv_weights_as_inputs():
    check_op("Conv", {"x": rand(2, 3, 6, 7, seed=1), "w": rand(4, 3, 2, 3, seed=2), "b": rand(4, seed=3)},
             {"pads": [1, 0, 0, 1]})


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_dilated_follows_spec(auto_pad):
    # onnxruntime refuses SAME with dilations, so the ONNX reference implementation judges.
    x, w = rand(1, 2, 9, 10, seed=1), rand(3, 2, 3, 2, seed=2)
    model = build_model("Conv", {"x": x, "w": Const(w)},
                        {"auto_pad": auto_pad, "dilations": [2, 3], "strides": [1, 2]})
    _check_reference(model, {"x": x})


# ---- ConvTranspose ---------------------------------------------------------------------
CONVT_CASES = {
    "basic": ((1, 3, 5, 5), (3, 2, 3, 3), {}),
    "strided": ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2]}),
    "output_padding": ((1, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 3], "output_padding": [1, 2]}),
    "pads_asym": ((1, 2, 5, 6), (2, 3, 3, 4), {"strides": [2, 1], "pads": [1, 0, 2, 1]}),
    "dilated": ((1, 2, 5, 5), (2, 3, 3, 2), {"dilations": [2, 1], "strides": [1, 2], "output_padding": [0, 1]}),
    "grouped": ((1, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    "depthwise": ((1, 3, 6, 5), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    "output_shape": ((1, 3, 5, 5), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),
    "output_shape_outpad": ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [3, 2], "output_padding": [2, 1],
                                                         "output_shape": [11, 8]}),
    "output_shape_same_upper": ((1, 2, 5, 5), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 10],
                                                             "auto_pad": "SAME_UPPER"}),
    "output_shape_same_lower": ((1, 2, 5, 5), (2, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 10],
                                                             "auto_pad": "SAME_LOWER"}),
    "same_upper": ((1, 2, 5, 7), (2, 3, 3, 4), {"strides": [2, 3], "auto_pad": "SAME_UPPER"}),  # odd pads
    "same_lower": ((1, 2, 5, 7), (2, 3, 3, 4), {"strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    "same_dilated": ((1, 2, 5, 5), (2, 3, 3, 3), {"dilations": [2, 2], "auto_pad": "SAME_UPPER"}),
    "valid": ((1, 2, 5, 7), (2, 3, 4, 3), {"strides": [2, 3], "auto_pad": "VALID"}),
    "1d": ((2, 3, 7), (3, 5, 4), {"strides": [3], "output_padding": [1], "pads": [1, 2]}),
    "1d_output_shape": ((1, 3, 7), (3, 2, 3), {"strides": [2], "output_shape": [14]}),
    "3d": ((1, 2, 3, 4, 5), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]}),
    "3d_grouped": ((1, 4, 3, 3, 3), (4, 2, 2, 2, 2), {"group": 2, "strides": [2, 2, 2],
                                                      "output_padding": [1, 0, 1]}),
}


@pytest.mark.parametrize("case", list(CONVT_CASES))
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_conv_transpose(case, bias):
    xs, ws, attrs = CONVT_CASES[case]
    group = attrs.get("group", 1)
    inputs = {"x": rand(*xs, seed=1), "w": Const(rand(*ws, seed=2))}
    if bias:
        inputs["b"] = Const(rand(ws[1] * group, seed=3))
    check_op("ConvTranspose", inputs, attrs, expect_prims=["conv_transpose"] + (["add"] if bias else []))


@pytest.mark.parametrize("opset", [1, 11])
def test_conv_transpose_opsets(opset):
    check_op("ConvTranspose", {"x": rand(1, 2, 4, 5, seed=1), "w": rand(2, 3, 3, 3, seed=2), "b": rand(3, seed=3)},
             {"strides": [2, 2], "output_shape": [8, 10]}, opset=opset)


def test_conv_transpose_larger_output_shape_is_opaque():
    model = build_model("ConvTranspose", {"x": rand(1, 2, 4, 4, seed=1), "w": Const(rand(2, 2, 3, 3, seed=2))},
                        {"strides": [2, 2], "output_shape": [10, 10]})
    reasons = _opaque_reasons(model)
    assert len(reasons) == 1 and "exceeds" in reasons[0]


@pytest.mark.parametrize("xs,ws,bias", [
    ((1, 3, 8, 12), (5, 3, 4, 4), True),  # ViT-style patch embedding
    ((2, 4, 6, 9), (3, 4, 2, 3), False),  # unequal kernel, batch 2
    ((1, 32, 16, 16), (32, 32, 8, 8), True),  # SegFormer-B0's spatial reduction, scaled down
], ids=["patch4", "patch2x3_batch2", "sr8"])
def test_conv_with_tiling_windows_becomes_a_gemm(xs, ws, bias):
    # kernel = stride, no padding: one MATMUL over the patches (cuBLAS), not a CONV (cuDNN).
    inputs = {"x": rand(*xs, seed=1), "w": Const(rand(*ws, seed=2))}
    if bias:
        inputs["b"] = Const(rand(ws[0], seed=3))
    pg = check_op("Conv", inputs, {"strides": list(ws[2:])}, expect_prims=["matmul", "transpose"])
    assert "conv" not in _ops(pg)


def test_conv_with_tiling_windows_runs_through_generated_kernels():
    # The patch transposes are 6-D layout kernels: compiled and run (Triton's interpreter on a CPU).
    import torch
    from opcheck import run_ort

    import tessera

    m = build_model("Conv", {"x": rand(1, 8, 16, 16, seed=1), "w": Const(rand(16, 8, 4, 4, seed=2)),
                             "b": Const(rand(16, seed=3))}, {"strides": [4, 4]})
    exe = tessera.compile(m, tessera.CompileOptions(cost="analytical"))
    assert any(s.impl.backend == "triton" for s in exe.steps) and any(s.impl.backend == "linear" for s in exe.steps)
    x = rand(1, 8, 16, 16, seed=11)
    (got,) = exe(torch.from_numpy(x))
    (ref,) = run_ort(m, {"x": x})
    assert rel_l2(got.numpy(), ref) < 1e-5


@pytest.mark.parametrize("xs,ws", [
    ((1, 8, 16, 8192), (1, 8, 8192, 17)),  # EfficientViT's linear attention, K halved
    ((16, 4096), (4096, 8)),  # plain 2-D
], ids=["attention", "2d"])
def test_matmul_with_a_long_reduction_and_a_tiny_output_is_split(xs, ws):
    from tessera.ops.linear import _split_k

    pg = check_op("MatMul", {"x": rand(*xs, seed=1), "w": rand(*ws, seed=2)}, expect_prims=["matmul", "reduce_sum"])
    mm = [n for n in pg.nodes if n.op == "matmul"]
    chunks = _split_k(int(np.prod(xs[:-2])), xs[-2], ws[-1], xs[-1])
    assert len(mm) == 1 and chunks > 1 and pg.types[mm[0].inputs[0]].shape[-1] == xs[-1] // chunks


def test_matmul_split_rule_leaves_ordinary_gemms_alone():
    from tessera.ops.linear import _split_k

    assert _split_k(1, 128, 3072, 768) == 1  # BERT's FFN: K is short
    assert _split_k(12, 128, 128, 8192) == 1  # many output tiles already
    assert _split_k(8, 16, 17, 16384) == 32  # 512 per chunk
    assert _split_k(1, 16, 16, 4160) == 8  # chunks of 520: halving stops before 512
    assert _split_k(1, 16, 16, 4097) == 1  # odd K: no even split


def test_split_matmul_runs_through_generated_kernels():
    # The chunk transpose and the sum over chunks (a middle-axis reduction) as generated kernels.
    import torch
    from opcheck import run_ort

    import tessera

    m = build_model("MatMul", {"x": rand(1, 2, 16, 4096, seed=1), "w": rand(1, 2, 4096, 17, seed=2)})
    exe = tessera.compile(m, tessera.CompileOptions(cost="analytical"))
    assert any(s.impl.backend == "triton" for s in exe.steps)
    x, w = rand(1, 2, 16, 4096, seed=11), rand(1, 2, 4096, 17, seed=12)
    (got,) = exe(torch.from_numpy(x), torch.from_numpy(w))
    (ref,) = run_ort(m, {"x": x, "w": w})
    assert rel_l2(got.numpy(), ref) < 1e-5


# ---- Einsum (session 51) ------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores, K not transposed first
    ("bhqk,bhkd->bqhd", [(2, 3, 5, 7), (2, 3, 7, 8)]),  # and the output in another order
    ("i,i->", [(7,), (7,)]), ("i,j->ij", [(3,), (4,)]), ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]), ("abcd->dcba", [(2, 3, 4, 5)]), ("ij,ij->i", [(3, 4), (3, 4)]), ("i,ij->j", [(4,), (4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]), ("...i,...i->...", [(2, 1, 4), (2, 3, 4)]),
    ("...ij,jk", [(2, 3, 4, 5), (5, 6)]), ("bij,jk", [(2, 3, 4), (4, 5)]), ("ba", [(3, 4)]),  # implicit outputs
    ("abc,abc->abc", [(1, 1, 4), (1, 1, 4)]), ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]), ("nchw,kc->nkhw", [(2, 3, 4, 5), (6, 3)]),
    ("ab,cd->", [(2, 3), (4, 5)]), ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),
    ("...a", [(1, 1, 1, 2, 3, 1, 1, 1, 1, 1, 4, 5)]),  # eleven ellipsis dims keep their order (not "…10" < "…2")
]


@pytest.mark.parametrize("equation,shapes", EINSUM_CASES, ids=[c[0] for c in EINSUM_CASES])
def test_einsum(equation, shapes):
    """Pairwise contractions as batched MATMULs, sums of labels nothing keeps, outer and elementwise
    products, transposes, ellipses (a size-1 dim broadcast), implicit outputs, three operands."""
    inputs = {f"x{i}": rand(*s, seed=90 + i) for i, s in enumerate(shapes)}
    check_op("Einsum", inputs, {"equation": equation}, opset=12)


def test_einsum_contractions_are_matmuls():
    pg = check_op("Einsum", {"q": rand(2, 3, 5, 8, seed=95), "k": rand(2, 3, 7, 8, seed=96)},
                  {"equation": "bhqd,bhkd->bhqk"}, opset=12)
    assert [n.op for n in pg.nodes].count("matmul") == 1


def test_einsum_half():
    check_op("Einsum", {"a": rand(4, 6, seed=97).astype(np.float16), "b": rand(6, 3, seed=98).astype(np.float16)},
             {"equation": "ij,jk->ik"}, opset=12, tol=2e-3)


# A label twice in one operand: its diagonal (session 58; until then the node stayed opaque)
EINSUM_DIAGONALS = [
    ("ii->i", [(4, 4)]), ("ii", [(5, 5)]), ("ii->", [(4, 4)]),  # a diagonal; traces, implicit and explicit
    ("bii->bi", [(3, 4, 4)]), ("iib->bi", [(4, 4, 3)]), ("ibi->ib", [(4, 3, 4)]), ("iii->i", [(3, 3, 3)]),
    ("ijij->ij", [(2, 3, 2, 3)]), ("...ii->...i", [(2, 3, 5, 5)]), ("ii,ij->j", [(4, 4), (4, 5)]),
    ("bij,bjj->bi", [(2, 3, 4), (2, 4, 4)]), ("iij->ij", [(1, 1, 3)]),
]


@pytest.mark.parametrize("equation,shapes", EINSUM_DIAGONALS, ids=[c[0] for c in EINSUM_DIAGONALS])
def test_einsum_diagonals_and_traces(equation, shapes):
    inputs = {f"x{i}": rand(*s, seed=80 + i) for i, s in enumerate(shapes)}
    pg = check_op("Einsum", inputs, {"equation": equation}, opset=12)
    assert not any(n.op == "opaque" for n in pg.nodes)
    assert any(n.op == "slice" and max(n.attrs["steps"]) > 1 for n in pg.nodes) or max(max(s) for s in shapes) == 1


def test_einsum_diagonal_of_unequal_axes_is_refused_by_name():
    model = build_model("Einsum", {"x": rand(3, 4, seed=99)}, {"equation": "ii->i"}, opset=12)
    with pytest.raises(Exception, match="label 'i' repeats in one operand over axes of sizes 3 and 4"):
        fission(load(model).graph)
