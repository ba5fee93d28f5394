"""`runtime/torch_prims.py` against the NumPy reference interpreter.

Every primitive runs on tiny hand-built graphs (prime, non-power-of-two sizes;
random inputs that are never zero) through `run_node` on torch tensors, and
through `interp.run` on the same NumPy inputs. Float32 must agree to rel L2
1e-5, integers and bools exactly; float16 and bfloat16 graphs are compared with
the float64 reference at 1e-2. Two real models run node by node at the end.
Each test runs on the CPU and, where there is one, on a CUDA device.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import pytest
import torch

from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.builder import PrimBuilder
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.ir.prims import Prim
from tessera.runtime import torch_prims
from tessera.runtime.torch_prims import TORCH_DTYPES, run_node
from tessera.tolerance import rel_l2
from tessera.verify import random_inputs

F32, F16, BF16, F64 = DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64
I64, I32, I8, U8, BOOL = DType.INT64, DType.INT32, DType.INT8, DType.UINT8, DType.BOOL
MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


@pytest.fixture(params=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def dev(request: pytest.FixtureRequest) -> str:
    if request.param == "cuda":  # TF32 convolutions would miss the fp32 tolerance
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    return request.param


# ---- helpers ---------------------------------------------------------------------
def new_graph(**inputs: tuple[tuple[int, ...], DType]) -> tuple[Graph, PrimBuilder]:
    g = Graph(name="t", kind=GraphKind.PRIMITIVE)
    for name, (shape, dt) in inputs.items():
        g.inputs.append(name)
        g.types[name] = TensorType(tuple(shape), dt)
    return g, PrimBuilder(g)


def rand(rng: np.random.Generator, *shape: int, lo: float = -2.0, hi: float = 2.0,
         dtype: type = np.float32) -> np.ndarray:
    x = rng.uniform(lo, hi, size=shape)
    x[np.abs(x) < 1e-3] = 0.5  # never exactly zero
    return x.astype(dtype)


def to_torch(value: np.ndarray, t: TensorType, device: str) -> torch.Tensor:
    arr = np.array(value, dtype=t.dtype.to_numpy(), order="C")  # ascontiguousarray makes 0-d arrays 1-d
    return torch.from_numpy(arr).to(device=device, dtype=TORCH_DTYPES[t.dtype])


def run_torch(g: Graph, feeds: Mapping[str, np.ndarray], device: str = "cpu") -> dict[str, np.ndarray]:
    """Run a primitive graph node by node with `run_node`; outputs as NumPy
    (bfloat16 as float32). Checks every node's outputs against its declared types."""
    env = {n: to_torch(feeds[n], g.types[n], device) for n in g.inputs}
    env.update({n: to_torch(v, g.types[n], device) for n, v in g.constants.items()})
    last = {t: i for i, n in enumerate(g.topological_order()) for t in n.inputs}
    with torch.no_grad():
        for i, node in enumerate(g.topological_order()):
            types = [g.types[o] for o in node.outputs if o]
            outs = run_node(node, [env[t] for t in node.inputs if t], types, device=device, opsets=g.opsets)
            for o, y, t in zip([o for o in node.outputs if o], outs, types):
                assert y.dtype == TORCH_DTYPES[t.dtype] and tuple(y.shape) == t.shape, (node.name, y.dtype, y.shape)
                assert y.device.type == torch.device(device).type, node.name
                env[o] = y
            for t in [t for t in node.inputs if last.get(t) == i and t not in g.outputs]:
                env.pop(t, None)  # whole models: keep memory flat
    return {o: (env[o].float() if env[o].dtype is torch.bfloat16 else env[o]).cpu().numpy() for o in g.outputs}


def check(g: Graph, feeds: Mapping[str, np.ndarray], device: str, tol: float = 1e-5,
          exact: bool = False) -> dict[str, np.ndarray]:
    """torch == interp: floats within rel L2 `tol`, integers and bools exactly."""
    g.validate()
    ref = interp.run(g, feeds, exact=exact)
    got = run_torch(g, feeds, device)
    for name in g.outputs:
        r, o = ref[name], got[name]
        assert o.shape == r.shape, (name, o.shape, r.shape)
        if g.types[name].dtype.is_float:
            err = rel_l2(o, r)
            assert err < tol, f"{name}: torch vs interp rel L2 {err:.3g}"
        else:
            assert o.dtype == r.dtype and np.array_equal(o, r), name
    return got


def one(prim: Prim, inputs: dict[str, np.ndarray], attrs: dict | None, device: str,
        tol: float = 1e-5, dtypes: dict[str, DType] | None = None) -> np.ndarray:
    """One primitive over graph inputs; return the torch result after checking it."""
    dtypes = dtypes or {}
    g, b = new_graph(**{k: (v.shape, dtypes.get(k, DType.from_numpy(v.dtype))) for k, v in inputs.items()})
    y = b.emit(prim, list(inputs), attrs or {})
    g.outputs = [y]
    return check(g, inputs, device, tol)[y]


def test_every_primitive_has_a_kernel() -> None:
    assert set(torch_prims._KERNELS) | {Prim.OPAQUE} == set(Prim)
    assert set(TORCH_DTYPES) == set(DType)


# ---- elementwise -------------------------------------------------------------------
def test_fill(dev: str) -> None:
    g, b = new_graph(x=((3, 5), F32))
    y = b.emit(Prim.ADD, ["x", b.fill(2.5, (3, 5), F32)])
    g.outputs = [y, b.fill(-7, (2, 3), I32), b.fill(True, (7,), BOOL), b.fill(1.25, (), F64), b.fill(3, (2,), BF16)]
    got = check(g, {"x": rand(np.random.default_rng(0), 3, 5)}, dev)
    assert (got[g.outputs[1]] == -7).all() and got[g.outputs[2]].all() and got[g.outputs[3]] == 1.25


def test_cast_onnx_rules(dev: str) -> None:
    rng = np.random.default_rng(1)
    x = rand(rng, 4, 7, lo=-9, hi=9)
    x[0, :4] = [0.0, -0.0, 2.999, -2.999]  # zeros on purpose: float -> bool is x != 0
    g, b = new_graph(x=((4, 7), F32), k=((4, 7), BOOL), n=((4, 7), I32))
    g.outputs = [b.cast("x", I32), b.cast("x", I64), b.cast("x", I8), b.cast("x", BOOL), b.cast("x", F16),
                 b.cast("x", F64), b.cast(b.cast("x", BF16), F32), b.cast("k", F32), b.cast("n", F32),
                 b.cast("n", BOOL), b.cast("k", I64), b.cast("n", U8)]
    k = rng.uniform(size=(4, 7)) > 0.5
    n = rng.integers(-5, 5, size=(4, 7)).astype(np.int32)
    got = check(g, {"x": x, "k": k, "n": n}, dev)
    np.testing.assert_array_equal(got[g.outputs[0]], np.trunc(x).astype(np.int32))
    assert got[g.outputs[0]][0, 2] == 2 and got[g.outputs[0]][0, 3] == -2  # toward zero
    np.testing.assert_array_equal(got[g.outputs[3]], x != 0)


@pytest.mark.parametrize("prim,lo,hi", [
    (Prim.NEG, -3, 3), (Prim.ABS, -3, 3), (Prim.EXP, -4, 4), (Prim.LOG, 0.1, 9), (Prim.SQRT, 0.1, 9),
    (Prim.RECIPROCAL, 0.5, 3), (Prim.TANH, -4, 4), (Prim.ERF, -3, 3), (Prim.SIGMOID, -40, 40),
    (Prim.SIN, -20, 20), (Prim.COS, -20, 20), (Prim.FLOOR, -6, 6),
])
def test_unary_float(prim: Prim, lo: float, hi: float, dev: str) -> None:
    one(prim, {"x": rand(np.random.default_rng(2), 3, 11, 5, lo=lo, hi=hi)}, None, dev)


def test_isnan_and_not(dev: str) -> None:
    x = rand(np.random.default_rng(3), 5, 7)
    x[1, 2] = x[4, 0] = np.nan
    np.testing.assert_array_equal(one(Prim.ISNAN, {"x": x}, None, dev), np.isnan(x))
    k = np.random.default_rng(4).uniform(size=(3, 7)) > 0.5
    np.testing.assert_array_equal(one(Prim.NOT, {"k": k}, None, dev), ~k)


@pytest.mark.parametrize("prim", [Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.MOD, Prim.MAX, Prim.MIN,
                                  Prim.EQUAL, Prim.GREATER, Prim.LESS])
def test_binary_float(prim: Prim, dev: str) -> None:
    rng = np.random.default_rng(5)
    x, y = rand(rng, 2, 7, 3), rand(rng, 2, 7, 3)
    y[0, :2] = x[0, :2]  # ties for EQUAL/MAX
    one(prim, {"x": x, "y": y}, None, dev)


def test_pow(dev: str) -> None:
    rng = np.random.default_rng(6)
    one(Prim.POW, {"x": rand(rng, 5, 13, lo=0.2, hi=3), "y": rand(rng, 5, 13, lo=-2, hi=2)}, None, dev)
    n = rng.integers(-4, 5, size=(31,)).astype(np.int64)
    e = rng.integers(-3, 4, size=(31,)).astype(np.int64)
    n[:4], e[:4] = [1, -1, -1, 2], [-3, -3, -2, -1]  # x ** -k: 1, -1, 1, 0
    got = one(Prim.POW, {"x": n, "y": e}, None, dev)
    assert list(got[:4]) == [1, -1, 1, 0]


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_div_truncates(dt: type, dev: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(-50, 50, size=(7, 11)).astype(dt)
    y = rng.integers(1, 9, size=(7, 11)).astype(dt) * rng.choice([-1, 1], size=(7, 11)).astype(dt)
    np.testing.assert_array_equal(one(Prim.DIV, {"x": x, "y": y}, None, dev), np.trunc(x / y).astype(dt))
    got = one(Prim.DIV, {"x": np.array([-7, 7, -7, 5], dt), "y": np.array([2, -2, -2, 0], dt)}, None, dev)
    assert list(got[:3]) == [-3, -3, 3]  # a zero divisor is undefined in ONNX; it must not raise


def test_max_min_propagate_nan(dev: str) -> None:
    rng = np.random.default_rng(8)
    x, y = rand(rng, 3, 5), rand(rng, 3, 5)
    x[0, 1], y[2, 3] = np.nan, np.nan
    for prim in (Prim.MAX, Prim.MIN):
        got = one(prim, {"x": x, "y": y}, None, dev)
        assert np.isnan(got[0, 1]) and np.isnan(got[2, 3]) and np.isnan(got).sum() == 2
    for prim in (Prim.REDUCE_MAX, Prim.REDUCE_MIN):
        got = one(prim, {"y": y}, {"axes": (1,)}, dev)
        assert np.isnan(got[2, 0]) and not np.isnan(got[:2]).any()
        got = one(prim, {"x": x}, {"axes": (0,)}, dev)
        assert np.isnan(got[0, 1]) and np.isnan(got).sum() == 1


def test_integer_binary_and_logic(dev: str) -> None:
    rng = np.random.default_rng(9)
    a, c = rng.integers(-9, 9, size=(4, 7)), rng.integers(-9, 9, size=(4, 7))
    for prim in (Prim.ADD, Prim.SUB, Prim.MUL, Prim.MAX, Prim.MIN, Prim.EQUAL, Prim.GREATER, Prim.LESS):
        one(prim, {"x": a, "y": c}, None, dev)
        one(prim, {"x": a.astype(np.int32), "y": c.astype(np.int32)}, None, dev)
    p, q = rng.uniform(size=(5, 3)) > 0.5, rng.uniform(size=(5, 3)) > 0.3
    np.testing.assert_array_equal(one(Prim.AND, {"p": p, "q": q}, None, dev), p & q)
    np.testing.assert_array_equal(one(Prim.OR, {"p": p, "q": q}, None, dev), p | q)


def test_where(dev: str) -> None:
    rng = np.random.default_rng(10)
    c = rng.uniform(size=(3, 7, 5)) > 0.5
    x, y = rand(rng, 3, 7, 5), rand(rng, 3, 7, 5)
    np.testing.assert_array_equal(one(Prim.WHERE, {"c": c, "x": x, "y": y}, None, dev), np.where(c, x, y))


# ---- reduce / broadcast -----------------------------------------------------------
@pytest.mark.parametrize("prim", [Prim.REDUCE_SUM, Prim.REDUCE_MAX, Prim.REDUCE_MIN])
@pytest.mark.parametrize("axes", [(0,), (1, 3), (0, 1, 2, 3)])
def test_reductions_keep_rank(prim: Prim, axes: tuple[int, ...], dev: str) -> None:
    x = rand(np.random.default_rng(11), 3, 5, 7, 2)
    assert one(prim, {"x": x}, {"axes": axes}, dev).ndim == 4
    n = np.random.default_rng(12).integers(-100, 100, size=(5, 7, 3)).astype(np.int32)
    one(prim, {"n": n}, {"axes": axes[:2] if axes != (1, 3) else (1,)}, dev)


def test_broadcast(dev: str) -> None:
    x = rand(np.random.default_rng(13), 3, 1, 5, 1)
    got = one(Prim.BROADCAST, {"x": x}, {"shape": (3, 7, 5, 2)}, dev)
    np.testing.assert_array_equal(got, np.broadcast_to(x, (3, 7, 5, 2)))


# ---- window reduce ------------------------------------------------------------------
def _wr(kind: str, kernel, strides, dilations, pads) -> dict:
    return {"kind": kind, "kernel": kernel, "strides": strides, "dilations": dilations, "pads": pads}


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape,kernel,strides,dil,pads", [
    ((2, 3, 13, 11), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    ((2, 3, 13, 11), (3, 2), (2, 1), (2, 1), (2, 0, 1, 1)),
    ((2, 3, 13, 11), (5, 5), (3, 2), (1, 1), (2, 2, 2, 2)),
    ((17,), (3,), (2,), (2,), (1, 2)),                                   # no batch/channel dims
    ((1, 2, 5, 7, 6), (2, 3, 2), (1, 2, 2), (1, 1, 2), (0, 1, 1, 1, 0, 0)),  # 3 spatial dims
    ((2, 3, 5, 9, 7), (2, 3), (2, 1), (1, 1), (0, 1, 1, 0)),              # extra leading dims
    ((2, 3, 5, 9, 7), (2, 2), (1, 2), (2, 1), (2, 0, 1, 2)),              # pads as large as the kernel
])
def test_window_reduce(kind, shape, kernel, strides, dil, pads, dev: str) -> None:
    x = rand(np.random.default_rng(14), *shape)
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr(kind, kernel, strides, dil, pads), dev)


def test_window_reduce_wholly_padded_window(dev: str) -> None:
    # Pads of 4 before a kernel of span 3: the first window reads padding only.
    x = rand(np.random.default_rng(15), 2, 3, 7, 5)
    attrs = ("sum", (3, 2), (1, 2), (1, 1), (4, 1, 0, 0))
    sm = one(Prim.WINDOW_REDUCE, {"x": x}, _wr(*attrs), dev)
    mx = one(Prim.WINDOW_REDUCE, {"x": x}, _wr("max", *attrs[1:]), dev)
    assert (sm[:, :, :2] == 0).all() and (mx[:, :, :2] == -np.inf).all() and np.isfinite(mx[:, :, 2:]).all()
    n = np.random.default_rng(16).integers(-30, 30, size=(2, 3, 7, 5)).astype(np.int32)
    mi = one(Prim.WINDOW_REDUCE, {"n": n}, _wr("max", *attrs[1:]), dev)
    assert (mi[:, :, :2] == np.iinfo(np.int32).min).all()
    one(Prim.WINDOW_REDUCE, {"n": n}, _wr(*attrs), dev)


@pytest.mark.parametrize("dt,kind", [(np.float64, "sum"), (np.int64, "max"), (np.int64, "sum"),
                                     (np.float16, "sum"), (np.float16, "max"), (np.uint8, "max")])
def test_window_reduce_dtypes(dt: type, kind: str, dev: str) -> None:
    x = rand(np.random.default_rng(38), 2, 3, 9, 7, lo=1, hi=60).astype(dt)
    tol = 1e-2 if dt == np.float16 else 1e-5
    one(Prim.WINDOW_REDUCE, {"x": x}, _wr(kind, (3, 2), (2, 1), (1, 2), (1, 0, 1, 1)), dev, tol)


# ---- layout ------------------------------------------------------------------------
def test_transpose_reshape(dev: str) -> None:
    x = rand(np.random.default_rng(17), 2, 3, 5, 7)
    one(Prim.TRANSPOSE, {"x": x}, {"perm": (2, 0, 3, 1)}, dev)
    one(Prim.RESHAPE, {"x": x}, {"shape": (6, 35)}, dev)
    g, b = new_graph(x=((2, 3, 5, 7), F32))
    g.outputs = [b.reshape(b.transpose("x", (3, 1, 2, 0)), (21, 10))]  # reshape of a permuted view
    check(g, {"x": x}, dev)


def test_slice_negative_steps(dev: str) -> None:
    x = rand(np.random.default_rng(18), 7, 11, 5)
    got = one(Prim.SLICE, {"x": x}, {"starts": (6, 1, 4), "steps": (-1, 3, -2), "shape": (7, 4, 3)}, dev)
    np.testing.assert_array_equal(got, x[6::-1, 1::3, 4::-2])
    got = one(Prim.SLICE, {"x": x}, {"starts": (5, 10, 0), "steps": (-2, -3, 1), "shape": (2, 3, 5)}, dev)
    np.testing.assert_array_equal(got, x[5:1:-2, 10:1:-3, :])
    n = np.random.default_rng(19).integers(-9, 9, size=(5, 3)).astype(np.int64)
    assert one(Prim.SLICE, {"n": n}, {"starts": (3, 2), "steps": (-3, -1), "shape": (2, 0)}, dev).shape == (2, 0)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("shape,pads", [
    ((3, 5, 7), (1, 0, 2, 2, 3, 1)),
    ((2, 3, 5, 4, 3), (0, 1, 2, 3, 1, 1, 0, 4, 1, 2)),
])
def test_pad_modes(mode: str, shape, pads, dev: str) -> None:
    x = rand(np.random.default_rng(20), *shape)
    got = one(Prim.PAD, {"x": x}, {"pads": pads, "mode": mode, "value": 1.5}, dev)
    r = len(shape)
    width = [(pads[i], pads[i + r]) for i in range(r)]
    extra = {"constant_values": 1.5} if mode == "constant" else {}
    np.testing.assert_array_equal(got, np.pad(x, width, mode=mode, **extra))
    n = np.random.default_rng(21).integers(-9, 9, size=shape).astype(np.int32)
    one(Prim.PAD, {"n": n}, {"pads": pads, "mode": mode, "value": 3.0}, dev)


def test_concat(dev: str) -> None:
    rng = np.random.default_rng(22)
    a, c, d = rand(rng, 2, 3, 5), rand(rng, 2, 7, 5), rand(rng, 2, 1, 5)
    one(Prim.CONCAT, {"a": a, "c": c, "d": d}, {"axis": 1}, dev)


def test_gather_negative_indices(dev: str) -> None:
    rng = np.random.default_rng(23)
    x = rand(rng, 5, 7, 3)
    idx = np.array([[0, -1, 3], [-7, 6, -2]], np.int64)
    np.testing.assert_array_equal(one(Prim.GATHER, {"x": x, "i": idx}, {"axis": 1}, dev), np.take(x, idx % 7, axis=1))
    one(Prim.GATHER, {"x": x, "i": np.array([-5, 4, 0], np.int32)}, {"axis": 0}, dev)
    one(Prim.GATHER, {"x": x, "i": np.array(-1, np.int64)}, {"axis": 2}, dev)  # scalar index drops the axis


def test_gather_elements_negative_indices(dev: str) -> None:
    rng = np.random.default_rng(24)
    x = rand(rng, 5, 7)
    idx = rng.integers(-7, 7, size=(3, 2)).astype(np.int64)  # smaller than the data off the axis
    np.testing.assert_array_equal(one(Prim.GATHER_ELEMENTS, {"x": x, "i": idx}, {"axis": 1}, dev),
                                  np.take_along_axis(x[:3], idx % 7, axis=1))
    one(Prim.GATHER_ELEMENTS, {"x": x, "i": rng.integers(-5, 5, size=(2, 7)).astype(np.int32)}, {"axis": 0}, dev)


# ---- linear ------------------------------------------------------------------------
def test_matmul(dev: str) -> None:
    rng = np.random.default_rng(25)
    one(Prim.MATMUL, {"a": rand(rng, 3, 2, 7, 13), "c": rand(rng, 3, 2, 13, 5)}, None, dev)
    one(Prim.MATMUL, {"a": rand(rng, 11, 3), "c": rand(rng, 3, 17)}, None, dev)
    n, m = rng.integers(-9, 9, size=(3, 5, 7)), rng.integers(-9, 9, size=(3, 7, 2))
    one(Prim.MATMUL, {"a": n, "c": m}, None, dev)
    one(Prim.MATMUL, {"a": n.astype(np.int32), "c": m.astype(np.int32)}, None, dev)



_ACTIVATIONS = {None: lambda y: y, "relu": torch.relu,
                "gelu_tanh": lambda y: torch.nn.functional.gelu(y, approximate="tanh")}


@pytest.mark.parametrize("activation", list(_ACTIVATIONS))
@pytest.mark.parametrize("a_shape,b_shape", [((1, 6, 13), (13, 5)), ((3, 6, 13), (13, 5)), ((3, 6, 13), (3, 13, 5)),
                                             ((2, 3, 6, 13), (1, 3, 13, 5))])
def test_linear_fused_activations(activation: str | None, a_shape, b_shape, dev: str) -> None:
    # The bias and activation in the library call (one right operand: addmm; batched alike: baddbmm,
    # then the activation; broadcast batches: matmul, then both): the tanh GELU either way. torch's
    # CPU `_addmm_activation(use_gelu=True)` is the erf GELU, 1e-4 away.
    rng = np.random.default_rng(26)
    a, b, bias = (torch.from_numpy(rand(rng, *s)).to(dev) for s in (a_shape, b_shape, (5,)))
    node = Node("mm", Prim.MATMUL.value, ("a", "b"), ("y",))
    out = TensorType(a_shape[:-1] + (5,), F32)
    got = torch_prims.run_linear_fused(node, [a, b], out, bias, activation)
    want = _ACTIVATIONS[activation](torch.matmul(a.double(), b.double()) + bias.double())
    assert rel_l2(got.cpu().numpy(), want.cpu().numpy()) < 1e-6
    with pytest.raises(ValueError, match="activation"):
        torch_prims.run_linear_fused(node, [a, b], out, bias, "gelu_erf")


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("a_shape,b_shape", [((6, 13), (13, 5)), ((3, 6, 13), (3, 13, 5)), ((2, 3, 6, 13), (1, 3, 13, 5))])
def test_linear_fused_scales_the_product_by_alpha(activation: str | None, a_shape, b_shape, dev: str) -> None:
    rng = np.random.default_rng(28)
    a, b, bias = (torch.from_numpy(rand(rng, *s)).to(dev) for s in (a_shape, b_shape, (5,)))
    node = Node("mm", Prim.MATMUL.value, ("a", "b"), ("y",))
    out = TensorType(a_shape[:-1] + (5,), F32)
    got = torch_prims.run_linear_fused(node, [a, b], out, bias, activation, alpha=-0.5)
    want = _ACTIVATIONS[activation](-0.5 * torch.matmul(a.double(), b.double()) + bias.double())
    assert rel_l2(got.cpu().numpy(), want.cpu().numpy()) < 1e-6


@pytest.mark.parametrize("a_shape,b_shape", [((3, 6, 13), (13, 5)), ((3, 6, 13), (3, 13, 5)),
                                             ((2, 3, 6, 13), (1, 3, 13, 5)), ((6, 13), (3, 13, 5))])
def test_a_batched_library_call_adds_a_cancelling_bias_before_it_rounds(a_shape, b_shape, dev: str) -> None:
    # float16: the bias nearly cancels the product, so a product rounded before the add would be
    # several percent off the sum; added in the call, the sum rounds once. The last two broadcast
    # their batches.
    rng = np.random.default_rng(27)
    a = torch.from_numpy(rand(rng, *a_shape)).half()
    b = torch.from_numpy(rand(rng, *b_shape)).half()
    prod = torch.matmul(a.double(), b.double())
    for bias in (-(prod * 0.99).reshape(-1, 5), -(prod.reshape(-1, 5)[0] * 0.99)):  # whole [rows, columns], vector
        bias = bias.half()
        node = Node("mm", Prim.MATMUL.value, ("a", "b"), ("y",))
        got = torch_prims.run_linear_fused(node, [a.to(dev), b.to(dev)], TensorType(prod.shape, DType.FLOAT16),
                                           bias.to(dev), None)
        want = prod + (bias.double().reshape(prod.shape) if bias.dim() == 2 else bias.double())
        assert rel_l2(got.float().cpu().numpy(), want.numpy()) < 2e-3


def _conv_attrs(n: int, strides=None, pads=None, dilations=None, group: int = 1) -> dict:
    return {"strides": strides or (1,) * n, "pads": pads or (0,) * (2 * n),
            "dilations": dilations or (1,) * n, "group": group}


@pytest.mark.parametrize("c,o,k,strides,pads,dil,group", [
    (3, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),      # plain
    (6, 4, (3, 5), (2, 3), (1, 2, 0, 1), (1, 1), 2),      # grouped, strided, asymmetric pads
    (7, 7, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 7),      # depthwise, dilated
    (5, 10, (5, 3), (2, 1), (2, 1, 2, 1), (1, 2), 5),     # depthwise with multiplier 2
    (6, 9, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 3),      # 1x1 strided, grouped
    (6, 5, (1, 1), (2, 1), (1, 0, 0, 1), (1, 1), 1),      # 1x1, asymmetric pads
    (4, 3, (2, 2), (2, 2), (0, 0, 0, 0), (3, 1), 1),      # dilated, strided
])
def test_conv2d(c, o, k, strides, pads, dil, group, dev: str) -> None:
    rng = np.random.default_rng(26)
    x, w = rand(rng, 2, c, 13, 11), rand(rng, o, c // group, *k)
    one(Prim.CONV, {"x": x, "w": w}, _conv_attrs(2, strides, pads, dil, group), dev)


def test_conv_1d_3d(dev: str) -> None:
    rng = np.random.default_rng(27)
    one(Prim.CONV, {"x": rand(rng, 2, 4, 19), "w": rand(rng, 6, 2, 3)}, _conv_attrs(1, (2,), (1, 2), (2,), 2), dev)
    one(Prim.CONV, {"x": rand(rng, 1, 3, 7, 6, 5), "w": rand(rng, 4, 3, 3, 2, 3)},
        _conv_attrs(3, (1, 2, 1), (1, 0, 1, 1, 1, 1)), dev)
    one(Prim.CONV, {"x": rand(rng, 1, 3, 7, 6, 5), "w": rand(rng, 3, 1, 3, 3, 3)},
        _conv_attrs(3, pads=(1,) * 6, group=3), dev)


@pytest.mark.parametrize("c,o,k,strides,pads,dil,group,opad", [
    (3, 5, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, (0, 0)),
    (4, 6, (3, 2), (2, 3), (1, 0, 1, 0), (1, 1), 2, (1, 2)),     # grouped, output_padding
    (6, 6, (3, 3), (2, 2), (0, 1, 0, 1), (2, 1), 6, (1, 0)),     # depthwise, dilated
    (2, 3, (4, 4), (3, 2), (2, 1, 0, 3), (1, 2), 1, (2, 1)),     # asymmetric pads
    (3, 3, (2, 3), (1, 1), (0, 1, 1, 0), (1, 1), 3, (2, 1)),     # output_padding >= stride
    (3, 3, (3, 3), (1, 2), (1, 2, 2, 1), (1, 1), 1, (2, 1)),     # ... with pads on both sides
])
def test_conv_transpose(c, o, k, strides, pads, dil, group, opad, dev: str) -> None:
    rng = np.random.default_rng(28)
    x, w = rand(rng, 2, c, 5, 7), rand(rng, c, o // group, *k)
    attrs = {**_conv_attrs(2, strides, pads, dil, group), "output_padding": opad}
    one(Prim.CONV_TRANSPOSE, {"x": x, "w": w}, attrs, dev)


def test_conv_transpose_1d_3d(dev: str) -> None:
    rng = np.random.default_rng(29)
    one(Prim.CONV_TRANSPOSE, {"x": rand(rng, 1, 4, 11), "w": rand(rng, 4, 3, 5)},
        {**_conv_attrs(1, (3,), (2, 1), (1,), 1), "output_padding": (2,)}, dev)
    one(Prim.CONV_TRANSPOSE, {"x": rand(rng, 1, 4, 3, 5, 4), "w": rand(rng, 4, 3, 2, 3, 2)},
        {**_conv_attrs(3, (2, 1, 2), (1, 0, 1) * 2, (1, 2, 1), 2), "output_padding": (1, 0, 1)}, dev)


# ---- opaque ------------------------------------------------------------------------
def test_opaque(dev: str) -> None:
    rng = np.random.default_rng(30)
    g, b = new_graph(a=((3, 5, 7), F32), c=((3, 7, 2), F32), x=((4, 9), F32))
    e = b.emit(Prim.OPAQUE, ["a", "c"], {"op_type": "Einsum", "domain": "", "opset": 20,
                                         "onnx_attrs": {"equation": "bij,bjk->bik"}},
               out_type=TensorType((3, 5, 2), F32))
    y = b.emit(Prim.ADD, [e, e])
    k = b.const(np.array([3], np.int64), "k")
    g.nodes.append(Node(name="topk", op=Prim.OPAQUE.value, inputs=("x", k), outputs=("vals", "idx"),
                        attrs={"op_type": "TopK", "domain": "", "opset": 20, "onnx_attrs": {"axis": 1}}))
    g.types["vals"], g.types["idx"] = TensorType((4, 3), F32), TensorType((4, 3), I64)
    hi = b.const(np.array(0.5, np.float32), "hi")
    g.nodes.append(Node(name="clip", op=Prim.OPAQUE.value, inputs=("vals", "", hi), outputs=("clipped",),
                        attrs={"op_type": "Clip", "domain": "", "opset": 20, "onnx_attrs": {}}))
    g.types["clipped"] = TensorType((4, 3), F32)
    h = b.cast("a", BF16)  # bfloat16 crosses to onnxruntime as float32
    t = b.emit(Prim.OPAQUE, [h], {"op_type": "Transpose", "domain": "", "opset": 20,
                                  "onnx_attrs": {"perm": [2, 0, 1]}}, out_type=TensorType((7, 3, 5), BF16))
    g.outputs = [y, "idx", "clipped", b.cast(t, F32)]
    check(g, {"a": rand(rng, 3, 5, 7), "c": rand(rng, 3, 7, 2), "x": rand(rng, 4, 9)}, dev)


# ---- 16-bit floats -------------------------------------------------------------------
def _mixed_graph(dt: DType) -> Graph:
    g, b = new_graph(x=((2, 5, 9, 7), dt), w=((6, 5, 3, 3), dt), m=((7, 11), dt))
    c = b.emit(Prim.CONV, ["x", "w"], _conv_attrs(2, pads=(1, 0, 1, 2)))
    p = b.emit(Prim.WINDOW_REDUCE, [c], _wr("sum", (3, 2), (2, 1), (1, 1), (1, 0, 1, 1)))
    q = b.emit(Prim.WINDOW_REDUCE, [c], _wr("max", (2, 2), (1, 1), (1, 1), (0, 0, 0, 0)))
    s = b.emit(Prim.SIGMOID, [b.emit(Prim.ERF, [q])])
    mm = b.emit(Prim.MATMUL, [b.emit(Prim.TANH, [c]), b.emit(Prim.BROADCAST, [b.reshape("m", (1, 1, 7, 11))],
                                                             {"shape": (2, 6, 7, 11)})])
    r = b.reduce(Prim.REDUCE_SUM, mm, (1, 3))
    d = b.div(b.emit(Prim.EXP, [s]), b.add_scalar(b.emit(Prim.ABS, [q]), 1.0))
    g.outputs = [p, r, d, b.cast(b.reduce(Prim.REDUCE_MAX, d, (2,)), F32)]
    return g


@pytest.mark.parametrize("dt,np_dt", [(F16, np.float16), (BF16, np.float32)])
def test_16bit_floats_vs_float64(dt: DType, np_dt: type, dev: str) -> None:
    g = _mixed_graph(dt)
    rng = np.random.default_rng(31)
    feeds = {n: rand(rng, *g.types[n].shape, lo=-1, hi=1).astype(np_dt) for n in g.inputs}
    check(g, feeds, dev, tol=1e-2, exact=True)


# ---- whole models ------------------------------------------------------------------
@pytest.mark.parametrize("model", ["candy_small.onnx", "bert_tiny.onnx"])
def test_model_node_by_node(model: str, dev: str) -> None:
    path = MODELS / model
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    loaded = load(path)
    pg = fission(loaded.graph).graph
    feeds = random_inputs(loaded.graph, seed=3)
    check(pg, feeds, dev, tol=1e-4)


@pytest.mark.parametrize("groups,filters,width", [(4, 8, 3), (4, 8, 4), (8, 16, 3), (2, 4, 3)])
def test_a_bfloat16_depthwise_convolution_on_channels_last_data_is_right_on_the_cpu(groups, filters, width):
    # torch 2.13's CPU bfloat16 depthwise convolution with two filters a channel, strides (1, 2) and a
    # few columns is 32-117% off on channels-last data (the CPU fuzzer, session 48); tessera's call runs it
    # on a row-major copy there. Judged against float64, as bfloat16 rounds (about 3e-3 here).
    gen = torch.Generator().manual_seed(groups + width)
    x = torch.randn(1, groups, 5, width, generator=gen)
    w = torch.randn(filters, 1, 3, 3, generator=gen)
    node = Node("c", Prim.CONV.value, ("x", "w"), ("y",),
                {"strides": (1, 2), "pads": (0, 0, 0, 0), "dilations": (1, 1), "group": groups})
    ref = torch.nn.functional.conv2d(x.double(), w.double(), stride=(1, 2), groups=groups)
    xb = x.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y = torch_prims._convolve(2, xb, w.to(torch.bfloat16), None, (1, 2), (0, 0), (1, 1), groups)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert rel_l2(y.double().numpy(), ref.numpy()) < 1e-2
    t = TensorType(DType.BFLOAT16, tuple(ref.shape))
    got = torch_prims._conv(node, [xb, w.to(torch.bfloat16)], t, torch.device("cpu"))
    assert rel_l2(got.double().numpy(), ref.numpy()) < 1e-2
