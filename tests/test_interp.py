"""The reference interpreter (`ir/interp.py`) and the ONNX exporter
(`ir/onnx_export.py`) on tiny hand-built primitive graphs.

Every primitive is run three ways: the interpreter in the declared dtypes, the
interpreter in float64 (exact=True), and the exported model in onnxruntime.
Convolutions and pooling are also checked against torch.nn.functional.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from tessera.errors import ShapeError
from tessera.ir import interp, interp_linear
from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.onnx_export import to_onnx
from tessera.ir.prims import Prim
from tessera.tolerance import TOLERANCE, rel_l2

F32, F64, F16, I64, I32, BOOL = DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.INT64, DType.INT32, DType.BOOL


# ---- helpers ---------------------------------------------------------------------
def new_graph(**inputs: tuple[tuple[int, ...], DType]) -> tuple[Graph, PrimBuilder]:
    g = Graph(name="t", kind=GraphKind.PRIMITIVE)
    for name, (shape, dt) in inputs.items():
        g.inputs.append(name)
        g.types[name] = TensorType(tuple(shape), dt)
    b = PrimBuilder(g)
    b.source = ("onnx_src",)
    return g, b


def rand(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0,
         dtype: type = np.float32) -> np.ndarray:
    x = rng.uniform(lo, hi, size=shape)
    x[np.abs(x) < 1e-3] = 0.5  # never exactly zero
    return x.astype(dtype)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(g: Graph, feeds: dict[str, np.ndarray], tol: float = 1e-5) -> dict[str, np.ndarray]:
    """interp == exported model in onnxruntime; exact=True is float64 and agrees."""
    g.validate()
    got = interp.run(g, feeds)
    exact = interp.run(g, feeds, exact=True)
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and all(names)
    ref = run_ort(model, feeds)
    for name, r in zip(g.outputs, ref):
        t = g.types[name]
        out = got[name]
        assert out.dtype == t.dtype.to_numpy() and out.shape == t.shape, (name, out.dtype, out.shape)
        assert out.dtype == r.dtype and out.shape == r.shape
        err = rel_l2(out, r)
        assert err < tol, f"{name}: interp vs onnxruntime rel L2 {err:.3g}"
        e = exact[name]
        if t.dtype.is_float:
            assert e.dtype == np.float64
            err = rel_l2(out, e)
            limit = TOLERANCE["fp16"] if t.dtype in (F16, DType.BFLOAT16) else max(tol, TOLERANCE["fp32"])
            assert err < limit, f"{name}: exact vs declared rel L2 {err:.3g}"
        else:
            assert e.dtype == out.dtype and np.array_equal(e, out)
    return got


def one(prim: Prim, inputs: dict[str, np.ndarray], attrs: dict | None = None,
        tol: float = 1e-5) -> tuple[np.ndarray, Graph]:
    """A graph of one primitive over graph inputs; return its interpreted output."""
    g, b = new_graph(**{k: (v.shape, DType.from_numpy(v.dtype)) for k, v in inputs.items()})
    y = b.emit(prim, list(inputs), attrs or {})
    g.outputs = [y]
    return check(g, inputs, tol)[y], g


# ---- elementwise -------------------------------------------------------------------
def test_fill_every_dtype() -> None:
    g, b = new_graph(x=((3, 5), F32))
    f = b.fill(2.5, (3, 5), F32)
    y = b.emit(Prim.ADD, ["x", f])
    i = b.fill(-7, (2, 3), I32)
    t = b.fill(True, (7,), BOOL)
    s = b.fill(1.25, (), F64)
    g.outputs = [y, i, t, s]
    x = rand(np.random.default_rng(0), 3, 5)
    out = check(g, {"x": x})
    np.testing.assert_allclose(out[y], x + 2.5, rtol=1e-6)
    assert out[i].dtype == np.int32 and (out[i] == -7).all() and out[t].all() and out[s] == 1.25


def test_cast_onnx_rules() -> None:
    rng = np.random.default_rng(1)
    x = rand(rng, 4, 7, lo=-9, hi=9)
    x[0, :3] = [0.0, -0.0, 2.999]  # zeros on purpose: float -> bool is x != 0
    g, b = new_graph(x=((4, 7), F32), k=((4, 7), BOOL), n=((4, 7), I32))
    outs = [b.cast("x", I32), b.cast("x", I64), b.cast("x", BOOL), b.cast("x", F16), b.cast("x", F64),
            b.cast("k", F32), b.cast("n", F32), b.cast("n", BOOL), b.cast("k", I64)]
    g.outputs = outs
    k = rng.uniform(size=(4, 7)) > 0.5
    n = rng.integers(-5, 5, size=(4, 7)).astype(np.int32)
    got = check(g, {"x": x, "k": k, "n": n})
    np.testing.assert_array_equal(got[outs[0]], np.trunc(x).astype(np.int32))  # toward zero
    assert got[outs[0]][0, 2] == 2 and (got[outs[0]][x < 0] <= 0).all()
    np.testing.assert_array_equal(got[outs[2]], x != 0)
    np.testing.assert_array_equal(got[outs[5]], k.astype(np.float32))
    np.testing.assert_array_equal(got[outs[7]], n != 0)


@pytest.mark.parametrize("prim,lo,hi", [
    (Prim.NEG, -3, 3), (Prim.ABS, -3, 3), (Prim.EXP, -4, 4), (Prim.LOG, 0.1, 9), (Prim.SQRT, 0.1, 9),
    (Prim.RECIPROCAL, 0.5, 3), (Prim.TANH, -4, 4), (Prim.ERF, -3, 3), (Prim.SIGMOID, -40, 40),
    (Prim.SIN, -20, 20), (Prim.COS, -20, 20), (Prim.FLOOR, -6, 6),
])
def test_unary_float(prim: Prim, lo: float, hi: float) -> None:
    x = rand(np.random.default_rng(2), 3, 11, 5, lo=lo, hi=hi)
    one(prim, {"x": x})


def test_unary_values() -> None:
    x = np.array([-50.0, -3.0, 0.5, 60.0], np.float32)
    np.testing.assert_allclose(one(Prim.SIGMOID, {"x": x})[0], 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    np.testing.assert_allclose(one(Prim.ERF, {"x": x})[0], [math.erf(v) for v in x.tolist()], rtol=1e-6)


def test_isnan_and_not() -> None:
    x = rand(np.random.default_rng(3), 5, 7)
    x[1, 2] = x[4, 0] = np.nan
    y, _ = one(Prim.ISNAN, {"x": x})
    np.testing.assert_array_equal(y, np.isnan(x))
    k = np.random.default_rng(4).uniform(size=(3, 7)) > 0.5
    np.testing.assert_array_equal(one(Prim.NOT, {"k": k})[0], ~k)


@pytest.mark.parametrize("prim", [Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.MAX, Prim.MIN,
                                  Prim.EQUAL, Prim.GREATER, Prim.LESS])
def test_binary_float(prim: Prim) -> None:
    rng = np.random.default_rng(5)
    x, y = rand(rng, 2, 7, 3), rand(rng, 2, 7, 3)
    y[0, :2] = x[0, :2]  # some ties for EQUAL/MAX
    one(prim, {"x": x, "y": y})


def test_pow() -> None:
    rng = np.random.default_rng(6)
    one(Prim.POW, {"x": rand(rng, 5, 13, lo=0.2, hi=3), "y": rand(rng, 5, 13, lo=-2, hi=2)})
    n = rng.integers(-4, 5, size=(31,)).astype(np.int64)
    e = rng.integers(0, 4, size=(31,)).astype(np.int64)
    np.testing.assert_array_equal(one(Prim.POW, {"x": n, "y": e})[0], n ** e)


@pytest.mark.parametrize("dt", [np.float32, np.int32, np.int64])
def test_mod_is_c_remainder(dt: type) -> None:
    """MOD takes the dividend's sign (C's fmod), for floats and integers alike."""
    x = np.array([7, -7, 7, -7, 6, 0], dt)
    y = np.array([3, 3, -3, -3, 3, 5], dt)
    got, _ = one(Prim.MOD, {"x": x, "y": y})
    np.testing.assert_array_equal(got, np.array([1, -1, 1, -1, 0, 0], dt))
    f, _ = one(Prim.MOD, {"x": np.array([5.5, -5.5], np.float32), "y": np.array([-2.0, 2.0], np.float32)})
    np.testing.assert_array_equal(f, [1.5, -1.5])


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_div_truncates(dt: type) -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, size=(7, 11)).astype(dt)
    y = rng.integers(1, 9, size=(7, 11)).astype(dt) * rng.choice([-1, 1], size=(7, 11)).astype(dt)
    got, _ = one(Prim.DIV, {"x": x, "y": y})
    np.testing.assert_array_equal(got, (np.trunc(x / y)).astype(dt))
    assert one(Prim.DIV, {"x": np.array([-7], dt), "y": np.array([2], dt)})[0][0] == -3


def test_max_min_propagate_nan() -> None:
    rng = np.random.default_rng(8)
    x, y = rand(rng, 3, 5), rand(rng, 3, 5)
    x[0, 1], y[2, 3] = np.nan, np.nan
    for prim in (Prim.MAX, Prim.MIN):
        got, _ = one(prim, {"x": x, "y": y})
        assert np.isnan(got[0, 1]) and np.isnan(got[2, 3]) and np.isnan(got).sum() == 2


def test_integer_binary_and_logic() -> None:
    rng = np.random.default_rng(9)
    a, c = rng.integers(-9, 9, size=(4, 7)), rng.integers(-9, 9, size=(4, 7))
    for prim in (Prim.ADD, Prim.SUB, Prim.MUL, Prim.MAX, Prim.MIN, Prim.EQUAL, Prim.GREATER, Prim.LESS):
        one(prim, {"x": a, "y": c})
    p, q = rng.uniform(size=(5, 3)) > 0.5, rng.uniform(size=(5, 3)) > 0.3
    np.testing.assert_array_equal(one(Prim.AND, {"p": p, "q": q})[0], p & q)
    np.testing.assert_array_equal(one(Prim.OR, {"p": p, "q": q})[0], p | q)


def test_where() -> None:
    rng = np.random.default_rng(10)
    c = rng.uniform(size=(3, 7, 5)) > 0.5
    x, y = rand(rng, 3, 7, 5), rand(rng, 3, 7, 5)
    np.testing.assert_array_equal(one(Prim.WHERE, {"c": c, "x": x, "y": y})[0], np.where(c, x, y))


# ---- reduce / broadcast -----------------------------------------------------------
@pytest.mark.parametrize("prim", [Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.REDUCE_MIN])
@pytest.mark.parametrize("axes", [(0,), (1, 3), (0, 1, 2, 3)])
def test_reductions_keep_rank(prim: Prim, axes: tuple[int, ...]) -> None:
    x = rand(np.random.default_rng(11), 3, 5, 7, 2)
    got, _ = one(prim, {"x": x}, {"axes": axes})
    fn = {Prim.REDUCE_SUM: np.sum, Prim.REDUCE_MAX: np.max, Prim.REDUCE_MIN: np.min}[prim]
    np.testing.assert_allclose(got, fn(x.astype(np.float64), axis=axes, keepdims=True), rtol=1e-5)


def test_reduce_integer() -> None:
    x = np.random.default_rng(12).integers(-100, 100, size=(5, 7)).astype(np.int64)
    np.testing.assert_array_equal(one(Prim.REDUCE_SUM, {"x": x}, {"axes": (1,)})[0], x.sum(1, keepdims=True))


def test_broadcast() -> None:
    x = rand(np.random.default_rng(13), 3, 1, 5, 1)
    got, _ = one(Prim.BROADCAST, {"x": x}, {"shape": (3, 7, 5, 2)})
    np.testing.assert_array_equal(got, np.broadcast_to(x, (3, 7, 5, 2)))
    assert got.flags.writeable and got.flags.c_contiguous  # outputs are materialized


# ---- window reduce ------------------------------------------------------------------
def _wr(kind: str, kernel, strides, dilations, pads) -> dict:
    return {"kind": kind, "kernel": kernel, "strides": strides, "dilations": dilations, "pads": pads}


@pytest.mark.parametrize("kernel,strides,dil,pads", [
    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((3, 2), (2, 1), (2, 1), (2, 0, 1, 1)),
    ((5, 5), (3, 2), (1, 1), (2, 2, 2, 2)),
])
def test_window_reduce_vs_torch(kernel, strides, dil, pads) -> None:
    x = rand(np.random.default_rng(14), 2, 3, 13, 11)
    t = torch.from_numpy(x.astype(np.float64))
    mx, _ = one(Prim.WINDOW_REDUCE, {"x": x}, _wr("max", kernel, strides, dil, pads))
    sm, _ = one(Prim.WINDOW_REDUCE, {"x": x}, _wr("sum", kernel, strides, dil, pads))
    # torch pads symmetrically: pad explicitly (with -inf / 0), then pool without padding.
    tp = (pads[1], pads[3], pads[0], pads[2])
    ref_max = F.max_pool2d(F.pad(t, tp, value=-np.inf), kernel, strides, dilation=dil)
    np.testing.assert_allclose(mx, ref_max.numpy(), rtol=1e-6)
    if dil == (1, 1):
        ref_sum = F.avg_pool2d(F.pad(t, tp), kernel, strides) * np.prod(kernel)
        np.testing.assert_allclose(sm, ref_sum.numpy(), rtol=1e-5, atol=1e-5)


def test_window_reduce_any_rank() -> None:
    rng = np.random.default_rng(15)
    # No batch/channel dims, one spatial dim, three spatial dims, extra leading dims.
    x1 = rand(rng, 17)
    got, _ = one(Prim.WINDOW_REDUCE, {"x": x1}, _wr("sum", (3,), (2,), (2,), (1, 2)))
    xp = np.pad(x1, (1, 2))
    np.testing.assert_allclose(got, [xp[o * 2] + xp[o * 2 + 2] + xp[o * 2 + 4] for o in range(got.shape[0])],
                               rtol=1e-6)
    x3 = rand(rng, 1, 2, 5, 7, 6)
    got, _ = one(Prim.WINDOW_REDUCE, {"x": x3}, _wr("max", (2, 3, 2), (1, 2, 2), (1, 1, 2), (0, 1, 1, 1, 0, 0)))
    ref = F.max_pool3d(F.pad(torch.from_numpy(x3), (1, 0, 1, 0, 0, 1), value=-np.inf), (2, 3, 2), (1, 2, 2),
                       dilation=(1, 1, 2))
    np.testing.assert_allclose(got, ref.numpy())
    x5 = rand(rng, 2, 3, 5, 9, 7)
    one(Prim.WINDOW_REDUCE, {"x": x5}, _wr("sum", (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)))
    one(Prim.WINDOW_REDUCE, {"x": x5}, _wr("max", (2, 3), (2, 1), (1, 1), (0, 1, 1, 0)))
    # Pads as large as the kernel (MaxPool refuses them; the export uses Pad + Slices).
    one(Prim.WINDOW_REDUCE, {"x": x5}, _wr("max", (2, 2), (1, 2), (2, 1), (2, 0, 1, 2)))


def test_window_reduce_integer() -> None:
    x = np.random.default_rng(16).integers(-30, 30, size=(2, 3, 7, 5)).astype(np.int32)
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr("sum", (2, 2), (1, 1), (1, 1), (1, 0, 0, 1)))
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr("max", (3, 2), (2, 1), (1, 1), (1, 1, 1, 1)))


@pytest.mark.parametrize("dt,kind", [(np.float64, "sum"), (np.int64, "max"), (np.int64, "sum"),
                                     (np.float16, "sum"), (np.float16, "max"), (np.uint8, "max")])
def test_window_reduce_dtypes(dt: type, kind: str) -> None:
    # float64/int sums and int64 max have no onnxruntime pooling kernel: they export as Pad + Slices.
    x = rand(np.random.default_rng(38), 2, 3, 9, 7, lo=1, hi=60).astype(dt)
    tol = TOLERANCE["fp16"] if dt == np.float16 else TOLERANCE["fp32"]
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr(kind, (3, 2), (2, 1), (1, 2), (1, 0, 1, 1)), tol=tol)
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr(kind, (2, 1), (1, 1), (1, 1), (0, 0, 1, 0)), tol=tol)


# ---- layout ------------------------------------------------------------------------
def test_transpose_reshape() -> None:
    x = rand(np.random.default_rng(17), 2, 3, 5, 7)
    np.testing.assert_array_equal(one(Prim.TRANSPOSE, {"x": x}, {"perm": (2, 0, 3, 1)})[0], x.transpose(2, 0, 3, 1))
    np.testing.assert_array_equal(one(Prim.RESHAPE, {"x": x}, {"shape": (6, 35)})[0], x.reshape(6, 35))
    # A reshape of a transposed view: row-major order of the transposed tensor.
    g, b = new_graph(x=((2, 3, 5, 7), F32))
    y = b.reshape(b.transpose("x", (3, 1, 2, 0)), (21, 10))
    g.outputs = [y]
    np.testing.assert_array_equal(check(g, {"x": x})[y], x.transpose(3, 1, 2, 0).reshape(21, 10))
    # Empty tensors: a 0 in a RESHAPE shape is an extent, not ONNX's "copy this dim".
    assert one(Prim.RESHAPE, {"e": np.zeros((0, 3), np.float32)}, {"shape": (3, 0, 1)})[0].shape == (3, 0, 1)


def test_slice_negative_steps() -> None:
    x = rand(np.random.default_rng(18), 7, 11, 5)
    got, _ = one(Prim.SLICE, {"x": x}, {"starts": (6, 1, 4), "steps": (-1, 3, -2), "shape": (7, 4, 3)})
    np.testing.assert_array_equal(got, x[6::-1, 1::3, 4::-2])
    got, _ = one(Prim.SLICE, {"x": x}, {"starts": (5, 10, 0), "steps": (-2, -3, 1), "shape": (2, 3, 5)})
    np.testing.assert_array_equal(got, x[5:1:-2, 10:1:-3, :])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_modes(mode: str) -> None:
    x = rand(np.random.default_rng(19), 3, 5, 7)
    pads = (1, 0, 2, 2, 3, 1)
    got, _ = one(Prim.PAD, {"x": x}, {"pads": pads, "mode": mode, "value": 1.5})
    width = [(1, 2), (0, 3), (2, 1)]
    ref = np.pad(x, width, mode=mode, **({"constant_values": 1.5} if mode == "constant" else {}))
    np.testing.assert_array_equal(got, ref)


def test_concat() -> None:
    rng = np.random.default_rng(20)
    a, c, d = rand(rng, 2, 3, 5), rand(rng, 2, 7, 5), rand(rng, 2, 1, 5)
    np.testing.assert_array_equal(one(Prim.CONCAT, {"a": a, "c": c, "d": d}, {"axis": 1})[0],
                                  np.concatenate([a, c, d], 1))


def test_gather_negative_indices() -> None:
    rng = np.random.default_rng(21)
    x = rand(rng, 5, 7, 3)
    idx = np.array([[0, -1, 3], [-7, 6, -2]], np.int64)
    got, _ = one(Prim.GATHER, {"x": x, "i": idx}, {"axis": 1})
    np.testing.assert_array_equal(got, np.take(x, idx % 7, axis=1))
    i32 = np.array([-5, 4, 0], np.int32)
    np.testing.assert_array_equal(one(Prim.GATHER, {"x": x, "i": i32}, {"axis": 0})[0], x[[0, 4, 0]])


def test_gather_elements_negative_indices() -> None:
    rng = np.random.default_rng(22)
    x = rand(rng, 5, 7)
    idx = rng.integers(-7, 7, size=(5, 3)).astype(np.int64)
    got, _ = one(Prim.GATHER_ELEMENTS, {"x": x, "i": idx}, {"axis": 1})
    np.testing.assert_array_equal(got, np.take_along_axis(x, idx % 7, axis=1))
    idx0 = rng.integers(-5, 5, size=(2, 7)).astype(np.int64)
    np.testing.assert_array_equal(one(Prim.GATHER_ELEMENTS, {"x": x, "i": idx0}, {"axis": 0})[0],
                                  np.take_along_axis(x, idx0 % 5, axis=0))


# ---- linear ------------------------------------------------------------------------
def test_matmul() -> None:
    rng = np.random.default_rng(23)
    a, c = rand(rng, 3, 2, 7, 13), rand(rng, 3, 2, 13, 5)
    got, _ = one(Prim.MATMUL, {"a": a, "c": c})
    np.testing.assert_allclose(got, a.astype(np.float64) @ c.astype(np.float64), rtol=1e-5, atol=1e-5)
    one(Prim.MATMUL, {"a": rand(rng, 11, 3), "c": rand(rng, 3, 17)})


def _conv_attrs(n: int, strides=None, pads=None, dilations=None, group: int = 1) -> dict:
    return {"strides": strides or (1,) * n, "pads": pads or (0,) * (2 * n),
            "dilations": dilations or (1,) * n, "group": group}


@pytest.mark.parametrize("c,o,k,strides,pads,dil,group", [
    (3, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),      # plain
    (6, 4, (3, 5), (2, 3), (1, 2, 0, 1), (1, 1), 2),      # grouped, strided, asymmetric pads
    (7, 7, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 7),      # depthwise, dilated
    (5, 10, (5, 3), (2, 1), (2, 1, 2, 1), (1, 2), 5),     # depthwise with multiplier 2
    (6, 9, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),      # 1x1
    (6, 9, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 3),      # 1x1 strided, grouped
    (6, 5, (1, 1), (2, 1), (1, 0, 0, 1), (1, 1), 1),      # 1x1 padded
    (4, 3, (2, 2), (2, 2), (0, 0, 0, 0), (3, 1), 1),      # dilated
])
def test_conv2d_vs_torch(c, o, k, strides, pads, dil, group) -> None:
    rng = np.random.default_rng(24)
    x, w = rand(rng, 2, c, 13, 11), rand(rng, o, c // group, *k)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(2, strides, pads, dil, group))
    tx = F.pad(torch.from_numpy(x.astype(np.float64)), (pads[1], pads[3], pads[0], pads[2]))
    ref = F.conv2d(tx, torch.from_numpy(w.astype(np.float64)), stride=strides, dilation=dil, groups=group)
    assert rel_l2(got, ref.numpy()) < 1e-6


def test_conv_1d_3d() -> None:
    rng = np.random.default_rng(25)
    x, w = rand(rng, 2, 4, 19), rand(rng, 6, 2, 3)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(1, (2,), (1, 2), (2,), 2))
    ref = F.conv1d(F.pad(torch.from_numpy(x), (1, 2)), torch.from_numpy(w), stride=2, dilation=2, groups=2)
    assert rel_l2(got, ref.numpy()) < 1e-5
    x, w = rand(rng, 1, 3, 7, 6, 5), rand(rng, 4, 3, 3, 2, 3)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(3, (1, 2, 1), (1, 0, 1, 1, 1, 1)))
    ref = F.conv3d(F.pad(torch.from_numpy(x), (1, 1, 0, 1, 1, 1)), torch.from_numpy(w), stride=(1, 2, 1))
    assert rel_l2(got, ref.numpy()) < 1e-5
    x, w = rand(rng, 1, 3, 7, 6, 5), rand(rng, 3, 1, 3, 3, 3)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(3, pads=(1,) * 6, group=3))
    ref = F.conv3d(torch.from_numpy(x), torch.from_numpy(w), padding=1, groups=3)
    assert rel_l2(got, ref.numpy()) < 1e-5


def test_conv_im2col_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interp_linear, "_CHUNK_BYTES", 1024)  # force many row chunks
    rng = np.random.default_rng(26)
    x, w = rand(rng, 2, 6, 17, 9), rand(rng, 4, 3, 3, 3)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(2, (2, 1), (1, 1, 1, 1), group=2))
    ref = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=(2, 1), padding=1, groups=2)
    assert rel_l2(got, ref.numpy()) < 1e-5


@pytest.mark.parametrize("c,o,k,strides,pads,dil,group,opad", [
    (3, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, (0, 0)),
    (4, 6, (3, 2), (2, 3), (1, 0), (1, 1), 2, (1, 2)),     # grouped, output_padding
    (6, 6, (3, 3), (2, 2), (0, 1), (2, 1), 6, (1, 0)),     # depthwise, dilated
    (2, 3, (4, 4), (3, 2), (2, 1), (1, 2), 1, (2, 1)),
])
def test_conv_transpose_vs_torch(c, o, k, strides, pads, dil, group, opad) -> None:
    rng = np.random.default_rng(27)
    x, w = rand(rng, 2, c, 5, 7), rand(rng, c, o // group, *k)
    attrs = {**_conv_attrs(2, strides, pads + pads, dil, group), "output_padding": opad}
    got, _ = one(Prim.CONV_TRANSPOSE, {"x": x, "w": w}, attrs)
    ref = F.conv_transpose2d(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(w.astype(np.float64)),
                             stride=strides, padding=pads, output_padding=opad, groups=group, dilation=dil)
    assert rel_l2(got, ref.numpy()) < 1e-6


def test_conv_transpose_3d() -> None:
    rng = np.random.default_rng(41)
    x, w = rand(rng, 1, 4, 3, 5, 4), rand(rng, 4, 3, 2, 3, 2)
    attrs = {**_conv_attrs(3, (2, 1, 2), (1, 0, 1) * 2, (1, 2, 1), 2), "output_padding": (1, 0, 1)}
    got, _ = one(Prim.CONV_TRANSPOSE, {"x": x, "w": w}, attrs)
    ref = F.conv_transpose3d(torch.from_numpy(x), torch.from_numpy(w), stride=(2, 1, 2), padding=(1, 0, 1),
                             output_padding=(1, 0, 1), groups=2, dilation=(1, 2, 1))
    assert rel_l2(got, ref.numpy()) < 1e-5


def test_conv_transpose_asymmetric_1d() -> None:
    rng = np.random.default_rng(28)
    x, w = rand(rng, 1, 4, 11), rand(rng, 4, 3, 5)
    got, _ = one(Prim.CONV_TRANSPOSE, {"x": x, "w": w},
                 {**_conv_attrs(1, (3,), (2, 1), (1,), 1), "output_padding": (2,)})
    full = F.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w), stride=3, output_padding=2)
    np.testing.assert_allclose(got, full.numpy()[..., 2:-1], rtol=1e-5, atol=1e-5)


# ---- opaque ------------------------------------------------------------------------
def test_opaque_einsum_and_hardmax() -> None:
    rng = np.random.default_rng(29)
    g, b = new_graph(a=((3, 5, 7), F32), c=((3, 7, 2), F32))
    e = b.emit(Prim.OPAQUE, ["a", "c"], {"op_type": "Einsum", "domain": "", "opset": 20,
                                         "onnx_attrs": {"equation": "bij,bjk->bik"}},
               out_type=TensorType((3, 5, 2), F32))
    h = b.emit(Prim.OPAQUE, [e], {"op_type": "Hardmax", "domain": "", "opset": 20, "onnx_attrs": {"axis": 1}},
               out_type=TensorType((3, 5, 2), F32))
    y = b.emit(Prim.ADD, [h, e])
    g.outputs = [e, y]
    a, c = rand(rng, 3, 5, 7), rand(rng, 3, 7, 2)
    got = check(g, {"a": a, "c": c})
    ein = np.einsum("bij,bjk->bik", a.astype(np.float64), c.astype(np.float64))
    np.testing.assert_allclose(got[e], ein, rtol=1e-5, atol=1e-5)
    hard = (ein == ein.max(axis=1, keepdims=True)).astype(np.float64)
    np.testing.assert_allclose(got[y], ein + hard, rtol=1e-5, atol=1e-5)
    ex = interp.run(g, {"a": a, "c": c}, exact=True)
    assert ex[e].dtype == np.float64


def test_opaque_multiple_outputs_and_omitted_input() -> None:
    rng = np.random.default_rng(30)
    g, b = new_graph(x=((4, 9), F32))
    k = b.const(np.array([3], np.int64), "k")
    node = Node(name="topk", op=Prim.OPAQUE.value, inputs=("x", k), outputs=("vals", "idx"),
                attrs={"op_type": "TopK", "domain": "", "opset": 20, "onnx_attrs": {"axis": 1, "largest": 1}},
                source=("topk_0",))
    g.nodes.append(node)
    g.types["vals"], g.types["idx"] = TensorType((4, 3), F32), TensorType((4, 3), I64)
    hi = b.const(np.array(0.5, np.float32), "hi")
    g.nodes.append(Node(name="clip", op=Prim.OPAQUE.value, inputs=("vals", "", hi), outputs=("clipped",),
                        attrs={"op_type": "Clip", "domain": "", "opset": 20, "onnx_attrs": {}}))
    g.types["clipped"] = TensorType((4, 3), F32)
    g.outputs = ["idx", "clipped"]
    x = rand(rng, 4, 9)
    got = check(g, {"x": x})
    order = np.argsort(-x, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(got["idx"], order)
    np.testing.assert_allclose(got["clipped"], np.minimum(np.take_along_axis(x, order, 1), 0.5))


def test_opaque_custom_domain() -> None:
    g, b = new_graph(x=((3, 7), F32))
    g.opsets["com.microsoft"] = 1
    y = b.emit(Prim.OPAQUE, ["x"], {"op_type": "Gelu", "domain": "com.microsoft", "opset": 17, "onnx_attrs": {}},
               out_type=TensorType((3, 7), F32))
    z = b.emit(Prim.MUL, [y, y])
    g.outputs = [z]
    x = rand(np.random.default_rng(40), 3, 7)
    got = check(g, {"x": x})[z]
    gelu = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    assert rel_l2(got, gelu * gelu) < 1e-5
    model = to_onnx(g)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 17), ("com.microsoft", 1)}



def test_bfloat16_is_float32_rounded_at_casts() -> None:
    g, b = new_graph(x=((2, 3), F32))
    h = b.cast("x", DType.BFLOAT16)
    t = b.emit(Prim.OPAQUE, [h], {"op_type": "Transpose", "domain": "", "opset": 20, "onnx_attrs": {"perm": [1, 0]}},
               out_type=TensorType((3, 2), DType.BFLOAT16))
    y = b.cast(b.emit(Prim.ADD, [t, t]), F32)
    g.outputs = [y]
    x = np.array([[1.001, 2.0, 3.0], [4.0, 5.0, -6.3]], np.float32)
    got = interp.run(g, {"x": x})[y]
    np.testing.assert_array_equal(got, 2 * np.array([[1, 4], [2, 5], [3, -6.3125]], np.float32))
    exact = interp.run(g, {"x": x}, exact=True)[y]
    # exact mode rounds only where onnxruntime runs the opaque node in its declared bfloat16
    assert exact.dtype == np.float64 and rel_l2(exact, 2 * x.T.astype(np.float64)) < TOLERANCE["bf16"]
    onnx.checker.check_model(to_onnx(g), full_check=True)


def test_exact_mode_rounds_narrow_casts_only_when_asked() -> None:
    g, b = new_graph(x=((3,), F32))
    y = b.cast(b.cast("x", DType.FLOAT16), F32)
    z = b.cast(b.cast("x", DType.BFLOAT16), F32)
    g.outputs = [y, z]
    x = np.array([1.0 + 2.0 ** -11 * 1.01, 3.0, -0.1], np.float32)  # the first just above an fp16 midpoint
    exact = interp.run(g, {"x": x}, exact=True)
    np.testing.assert_array_equal(exact[y], x.astype(np.float64))  # the cast keeps the float64 value
    rounded = interp.run(g, {"x": x}, exact=True, narrow_casts=True)
    np.testing.assert_array_equal(rounded[y], x.astype(np.float64).astype(np.float16).astype(np.float64))
    assert rounded[y][0] == 1.0 + 2.0 ** -10 and rounded[y].dtype == np.float64
    np.testing.assert_array_equal(rounded[z], x.astype(np.float64).astype(ml_dtypes.bfloat16).astype(np.float64))


# ---- run(): feeds, precision, memory ------------------------------------------------
def test_feed_checks_name_the_input() -> None:
    g, b = new_graph(x=((3, 5), F32), n=((2,), I64))
    g.outputs = [b.emit(Prim.NEG, ["x"])]
    x, n = rand(np.random.default_rng(31), 3, 5), np.array([1, 2], np.int64)
    with pytest.raises(ShapeError, match="'x'"):
        interp.run(g, {"n": n})
    with pytest.raises(ShapeError, match="'x'.*shape"):
        interp.run(g, {"x": x.T, "n": n})
    with pytest.raises(ShapeError, match="'n'.*dtype"):
        interp.run(g, {"x": x, "n": n.astype(np.float32)})
    with pytest.raises(ShapeError, match="'x'.*dtype"):
        interp.run(g, {"x": x.astype(np.int32), "n": n})
    interp.run(g, {"x": x.astype(np.float64), "n": n.astype(np.int32)})  # compatible types are converted


def test_exact_mode_is_float64() -> None:
    rng = np.random.default_rng(32)
    g, b = new_graph(x=((4, 6), F32))
    w = b.const(rand(rng, 6, 5), "w")
    y = b.matmul("x", w)
    s = b.emit(Prim.SIGMOID, [y])
    i = b.cast(s, I32)  # ints stay ints
    f = b.cast(i, F16)  # a cast to float16 is float64 in exact mode
    g.outputs = [s, i, f]
    x = rand(rng, 4, 6)
    lo, hi = interp.run(g, {"x": x}), interp.run(g, {"x": x}, exact=True)
    assert lo[s].dtype == np.float32 and hi[s].dtype == np.float64
    assert hi[i].dtype == np.int32 and hi[f].dtype == np.float64 and lo[f].dtype == np.float16
    assert rel_l2(lo[s], hi[s]) < 1e-6 and rel_l2(hi[s], lo[s].astype(np.float64)) > 0


def test_keep_all_and_freeing() -> None:
    g, b = new_graph(x=((3, 4), F32))
    t = b.emit(Prim.EXP, ["x"])
    u = b.emit(Prim.NEG, [t])
    y = b.emit(Prim.ADD, [u, t])
    g.outputs = [y]
    x = rand(np.random.default_rng(33), 3, 4)
    assert set(interp.run(g, {"x": x})) == {y}
    everything = interp.run(g, {"x": x}, keep_all=True)
    assert {"x", t, u, y} <= set(everything)
    np.testing.assert_allclose(everything[u], -np.exp(x), rtol=1e-6)


def test_inplace_reuse_never_clobbers_a_view() -> None:
    # t's last reader is NEG, which may write its result into t's buffer, but a
    # transposed view of t is still live (a graph output): t must not be reused.
    g, b = new_graph(x=((3, 5), F32))
    t = b.emit(Prim.EXP, ["x"])
    v = b.transpose(t, (1, 0))
    w = b.emit(Prim.NEG, [t])
    u = b.emit(Prim.ADD, [w, w])
    y = b.emit(Prim.MUL, [b.emit(Prim.EXP, [u]), b.emit(Prim.EXP, ["x"])])  # u dies unviewed: reusable
    g.outputs = [v, y]
    x = rand(np.random.default_rng(37), 3, 5)
    got = check(g, {"x": x})
    np.testing.assert_allclose(got[v], np.exp(x).T, rtol=1e-6)
    np.testing.assert_allclose(got[y], np.exp(-2 * np.exp(x)) * np.exp(x), rtol=1e-6)
    np.testing.assert_array_equal(x, rand(np.random.default_rng(37), 3, 5))  # feeds untouched


def test_float16_graph() -> None:
    rng = np.random.default_rng(34)
    x, w = rand(rng, 1, 4, 9, 7).astype(np.float16), rand(rng, 6, 4, 3, 3).astype(np.float16)
    got, _ = one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(2, pads=(1, 1, 1, 1)), tol=1e-2)
    assert got.dtype == np.float16


# ---- export ------------------------------------------------------------------------
def test_export_doc_strings_and_unique_names() -> None:
    g, b = new_graph(x=((2, 3, 7, 5), F32))
    b.source = ("conv_7", "relu_2")
    p = b.emit(Prim.WINDOW_REDUCE, ["x"], _wr("sum", (3, 2), (1, 1), (1, 1), (1, 0, 1, 1)), name="dup")
    b.source = ()
    q = b.emit(Prim.RESHAPE, [p], {"shape": (2, 3 * 7 * 5)}, name="dup/fold")
    g.outputs = [q]
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names)) and all(names)
    assert any("conv_7, relu_2" in n.doc_string for n in model.graph.node)
    assert all(n.doc_string for n in model.graph.node)
    assert {o.domain for o in model.opset_import} == {""} and model.opset_import[0].version == 20
    check(g, {"x": rand(np.random.default_rng(35), 2, 3, 7, 5)})


def test_export_operator_graph() -> None:
    rng = np.random.default_rng(36)
    w, bias = rand(rng, 4, 3, 3, 3), rand(rng, 4)
    g = Graph(name="ops", kind=GraphKind.OPERATOR, inputs=["x"], outputs=["y", "h"], opsets={"": 17})
    g.types.update({"x": TensorType((1, 3, 9, 7), F32), "w": TensorType(w.shape, F32),
                    "b": TensorType((4,), F32), "c": TensorType((1, 4, 5, 4), F32),
                    "r": TensorType((1, 4, 5, 4), F32), "y": TensorType((1, 4, 5, 4), F32),
                    "h": TensorType((1, 4, 5, 4), F32)})
    g.constants.update({"w": w, "b": bias})
    g.nodes = [
        Node("conv", "Conv", ("x", "w", "b"), ("c",),
             {"strides": (2, 2), "pads": (1, 1, 1, 1), "kernel_shape": (3, 3), "dilations": (1, 1)}),
        Node("act", "LeakyRelu", ("c",), ("r",), {"alpha": 1}),  # an int for a float attribute
        Node("act", "Einsum", ("r",), ("y",), {"equation": "nchw->nchw"}),  # duplicate name
        Node("", "Hardmax", ("r",), ("h",), {"axis": -1}),
    ]
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == 4 and all(names)
    x = rand(rng, 1, 3, 9, 7)
    y, h = run_ort(model, {"x": x})
    c = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias), stride=2, padding=1).numpy()
    ref = np.where(c > 0, c, c * 1.0)
    assert rel_l2(y, ref) < 1e-5
    np.testing.assert_array_equal(h, (ref == ref.max(-1, keepdims=True)).astype(np.float32))
