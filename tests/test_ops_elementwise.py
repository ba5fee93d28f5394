"""Elementwise operators against onnxruntime: arithmetic, comparisons, logic, activations."""
from __future__ import annotations

import numpy as np
import pytest

from opcheck import Const, check_op, rand

SHAPES = [((7,), (7,)), ((2, 3, 5), (5,)), ((1, 3, 1), (2, 1, 4)), ((4, 1), (3, 1, 6)), ((), (3, 2))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_arithmetic_broadcasting(op, sa, sb):
    y = rand(*sb, seed=2, lo=0.5, hi=2.0) if op == "Div" else rand(*sb, seed=2)
    pg = check_op(op, {"a": rand(*sa, seed=1), "b": y})
    if sa != sb:
        assert any(n.op == "broadcast" for n in pg.nodes)


@pytest.mark.parametrize("op", ["Add", "Div", "Mul"])
def test_integer_arithmetic(op):
    rng = np.random.default_rng(3)
    a = rng.integers(-50, 50, (4, 6)).astype(np.int64)
    b = rng.integers(1, 9, (6,)).astype(np.int64) * rng.choice([-1, 1], (6,))
    check_op(op, {"a": a, "b": b})  # Div truncates toward zero


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
def test_comparisons(op):
    a = np.round(rand(3, 5, seed=4)).astype(np.float32)
    b = np.round(rand(5, seed=5)).astype(np.float32)
    a[0, 0] = np.nan  # NaN compares false everywhere
    check_op(op, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or"])
def test_logic(op):
    rng = np.random.default_rng(6)
    check_op(op, {"a": rng.integers(0, 2, (3, 4)).astype(bool), "b": rng.integers(0, 2, (4,)).astype(bool)})


def test_not_and_isnan():
    check_op("Not", {"a": np.random.default_rng(7).integers(0, 2, (9,)).astype(bool)})
    x = rand(4, 5, seed=8)
    x[1, 2] = np.nan
    x[3, 0] = np.nan
    check_op("IsNaN", {"x": x}, expect_prims=["isnan"])


@pytest.mark.parametrize("op,lo,hi", [
    ("Neg", -3, 3), ("Abs", -3, 3), ("Exp", -3, 3), ("Log", 0.1, 5), ("Sqrt", 0.01, 9),
    ("Reciprocal", 0.5, 4), ("Tanh", -4, 4), ("Erf", -3, 3), ("Sigmoid", -8, 8),
])
def test_unary(op, lo, hi):
    check_op(op, {"x": rand(3, 7, 11, seed=9, lo=lo, hi=hi)})


@pytest.mark.parametrize("exp", [Const(np.float32(2.0)), Const(np.array([0.5, 3.0, -1.0], np.float32)),
                                 Const(np.int64(3))])
def test_pow(exp):
    check_op("Pow", {"x": rand(4, 3, seed=10, lo=0.2, hi=3.0), "y": exp})


@pytest.mark.parametrize("op", ["Max", "Min", "Sum"])
def test_variadic(op):
    check_op(op, {"a": rand(2, 3, 4, seed=11), "b": rand(4, seed=12), "c": rand(3, 1, seed=13)})
    check_op(op, {"a": rand(5, seed=14)})


def test_max_propagates_nan():
    a = rand(6, seed=15)
    a[2] = np.nan
    check_op("Max", {"a": a, "b": rand(6, seed=16)})


def test_where_broadcasts_all_three():
    rng = np.random.default_rng(17)
    check_op("Where", {"c": rng.integers(0, 2, (3, 1)).astype(bool), "x": rand(1, 4, seed=18), "y": rand(4, seed=19)})


@pytest.mark.parametrize("to,src", [
    (7, rand(5, 3, seed=20, lo=-40, hi=40)),  # float -> int64 truncates
    (1, np.random.default_rng(21).integers(-9, 9, (6,)).astype(np.int64)),
    (9, np.array([0.0, 1.5, -2.0, 0.0, 3.0], np.float32)),  # float -> bool
    (10, rand(4, 4, seed=22)),  # float16
    (1, np.array([True, False, True])),
])
def test_cast(to, src):
    check_op("Cast", {"x": src}, {"to": to})


def test_relu_and_leaky_relu():
    check_op("Relu", {"x": rand(2, 9, seed=23)}, expect_prims=["max", "fill"])
    check_op("LeakyRelu", {"x": rand(2, 9, seed=24)}, {"alpha": 0.13}, expect_prims=["where"])
    check_op("LeakyRelu", {"x": rand(17, seed=25)})


@pytest.mark.parametrize("inputs", [
    {"lo": Const(np.float32(-0.5)), "hi": Const(np.float32(0.7))},
    {"lo": Const(np.float32(0.0)), "__omit": None},  # ReLU-like: no max
    {"__omit0": None, "hi": Const(np.float32(6.0))},
    {"lo": rand(seed=26), "hi": Const(np.float32(1.0))},  # min as a graph input
])
def test_clip11(inputs):
    check_op("Clip", {"x": rand(3, 8, seed=27, lo=-3, hi=8)} | inputs)


def test_clip6_attributes():
    check_op("Clip", {"x": rand(3, 8, seed=28, lo=-3, hi=8)}, {"min": 0.0, "max": 6.0}, opset=6)
    check_op("Clip", {"x": rand(5, seed=29)}, {"max": 0.5}, opset=6)


def test_hard_sigmoid_hard_swish_softplus():
    check_op("HardSigmoid", {"x": rand(4, 6, seed=30, lo=-6, hi=6)}, {"alpha": 0.3, "beta": 0.4})
    check_op("HardSigmoid", {"x": rand(13, seed=31, lo=-6, hi=6)})
    check_op("HardSwish", {"x": rand(2, 5, 7, seed=32, lo=-6, hi=6)})
    check_op("Softplus", {"x": rand(3, 9, seed=33, lo=-30, hi=30)})  # large |x| stays finite


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    pg = check_op("Gelu", {"x": rand(3, 5, 7, seed=34, lo=-4, hi=4)}, {"approximate": approximate})
    assert ("tanh" if approximate == "tanh" else "erf") in {n.op for n in pg.nodes}


def test_identity_and_dropout():
    pg = check_op("Identity", {"x": rand(3, 4, seed=35)})
    assert len(pg.nodes) == 1  # the output copy; no arithmetic
    check_op("Dropout", {"x": rand(3, 4, seed=36)}, n_outputs=2)  # mask: all true
    check_op("Dropout", {"x": rand(3, 4, seed=37), "ratio": Const(np.float32(0.3))}, opset=13)


# ---- activations and the rest added in session 50 ----------------------------------------------
SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-8, -1e-8, 0.5, -0.5, 30.0, -30.0, 100.0], np.float32)


def _with_special(seed: int, *shape: int) -> np.ndarray:
    x = rand(*shape, seed=seed, lo=-4.0, hi=4.0)
    x.reshape(-1)[:SPECIAL.size] = SPECIAL
    return x


@pytest.mark.parametrize("op,attrs,opset", [
    ("Elu", {}, 6), ("Elu", {"alpha": 0.3}, 6), ("Selu", {}, 6), ("Selu", {"alpha": 1.5, "gamma": 2.0}, 6),
    ("Celu", {}, 12), ("Celu", {"alpha": 2.5}, 12), ("Mish", {}, 18), ("Softsign", {}, 1),
    ("ThresholdedRelu", {}, 10), ("ThresholdedRelu", {"alpha": -0.5}, 10), ("Shrink", {}, 9),
    ("Shrink", {"bias": 0.7, "lambd": 1.5}, 9), ("Sign", {}, 9), ("IsInf", {}, 10),
    ("IsInf", {"detect_negative": 0}, 10), ("IsInf", {"detect_positive": 0}, 10),
    ("IsInf", {"detect_positive": 0, "detect_negative": 0}, 10),
])
def test_activations_with_special_values(op, attrs, opset):
    """Each against onnxruntime on random values and on NaN, both infinities, signed zeros, tiny and
    saturating values (NaN must land where onnxruntime's does)."""
    check_op(op, {"x": _with_special(60, 4, 9)}, attrs, opset=opset)


def test_sign_of_integers_and_xor():
    check_op("Sign", {"x": np.array([[-7, 0, 3], [2, -1, 0]], np.int64)}, opset=13)
    rng = np.random.default_rng(61)
    check_op("Xor", {"a": rng.integers(0, 2, (3, 4)).astype(bool), "b": rng.integers(0, 2, (4,)).astype(bool)})


@pytest.mark.parametrize("slope_shape", [(1,), (3, 1, 1), (5,), (2, 3, 4, 5)])
def test_prelu_broadcasts_its_slope(slope_shape):
    check_op("PRelu", {"x": _with_special(62, 2, 3, 4, 5), "slope": Const(rand(*slope_shape, seed=63))}, opset=9)
    check_op("PRelu", {"x": rand(2, 3, 4, 5, seed=64), "slope": rand(*slope_shape, seed=65)}, opset=16)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_mean(n):
    check_op("Mean", {f"x{i}": rand(*((2, 1, 5) if i % 2 else (3, 5)), seed=66 + i) for i in range(n)}, opset=13)


# ---- trigonometry, rounding and Mod (session 51) -----------------------------------------------
# Ties, values one float32 step from a tie (0.49999997 + 0.5 rounds to 1 in float32), the last
# fractional float32s (2**23 - 0.5), integers past 2**23, signed zeros and tiny values whose result is
# a signed zero, infinities, NaN, a subnormal.
ROUNDING = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997,
                     -0.49999997, 0.50000006, 8388607.5, -8388607.5, 8388609.0, 1e30, -1e-30, 3e-39, 0.3,
                     -0.3, 0.7, -0.7, 7.0, -7.0], np.float32)


def _exactly_as_onnxruntime(op: str, inputs: dict, attrs: dict | None = None, opset: int = 20) -> None:
    """check_op's comparison, then every element equal to onnxruntime's, NaN where its NaN and zeros
    signed as its (rel L2 sees neither a zero's sign nor one integer off in a million)."""
    from opcheck import build_model, run_ort
    from tessera.fission import fission
    from tessera.frontend import load
    from tessera.ir import interp

    pg = check_op(op, inputs, attrs, opset=opset)
    feeds = {k: v for k, v in inputs.items() if not isinstance(v, Const)}
    ref = run_ort(build_model(op, inputs, attrs, opset=opset), feeds)[0]
    got = interp.run(fission(load(build_model(op, inputs, attrs, opset=opset)).graph).graph, feeds)[pg.outputs[0]]
    np.testing.assert_array_equal(got, ref)
    num = ~np.isnan(ref) if ref.dtype.kind == "f" else np.ones(ref.shape, bool)  # a NaN's sign means nothing
    assert (np.signbit(got) == np.signbit(ref))[num].all(), (op, inputs, got, ref)


@pytest.mark.parametrize("op,opset", [("Floor", 13), ("Ceil", 13), ("Round", 11)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rounding_is_exact(op, opset, dtype):
    x = np.concatenate([ROUNDING, rand(40, seed=70, lo=-6, hi=6), np.round(rand(10, seed=71, lo=-9, hi=9)) + 0.5])
    if dtype is np.float16:  # float16's last fractional values (1023.5) and its largest finite
        x = np.concatenate([x[~(np.isfinite(x) & (np.abs(x) > 6e4))], [1023.5, -1022.5, 2047.0, 65504.0, -0.25, 6e-8]])
    _exactly_as_onnxruntime(op, {"x": x.astype(dtype).reshape(1, -1)}, opset=opset)


@pytest.mark.parametrize("op", ["Sin", "Cos", "Tan"])
def test_trigonometry(op):
    """Near zero, around the poles of tan, and far out (rotary tables reach thousands of radians)."""
    x = np.concatenate([rand(60, seed=72, lo=-4, hi=4), rand(30, seed=73, lo=-1e4, hi=1e4),
                        np.array([0.0, -0.0, 1e-7, np.pi / 2, -np.pi / 2, np.nan, np.inf, -np.inf])]).astype(np.float32)
    check_op(op, {"x": x.reshape(2, -1)}, opset=7)
    check_op(op, {"x": x[np.isfinite(x)].astype(np.float16)}, opset=7, tol=2e-3)


def test_float_mod_is_fmod():
    """fmod=1: the remainder is exact and takes the dividend's sign, whatever the divisor's; broadcast."""
    x = np.concatenate([rand(30, seed=74, lo=-50, hi=50), ROUNDING]).astype(np.float32).reshape(4, -1)
    y = np.array([3.0, -3.0, 0.7, -1e-3] * (x.shape[1] // 4) + [2.5] * (x.shape[1] % 4), np.float32)
    _exactly_as_onnxruntime("Mod", {"x": x, "y": y}, {"fmod": 1}, opset=13)
    with np.errstate(over="ignore"):  # 1e30 becomes inf in float16, as meant
        x16 = x.astype(np.float16)
    _exactly_as_onnxruntime("Mod", {"x": x16, "y": Const(np.float16(0.75))}, {"fmod": 1}, opset=13)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_mod(fmod, dtype):
    """fmod=0 is Python's remainder (the divisor's sign), fmod=1 C's (the dividend's): every sign pair,
    exact multiples among them."""
    rng = np.random.default_rng(75)
    x = np.concatenate([rng.integers(-40, 40, 34), [12, -12, 0, 7]]).astype(dtype).reshape(2, -1)
    y = (rng.integers(1, 7, (19,)) * rng.choice([-1, 1], (19,))).astype(dtype)
    y[:2] = [3, -3]
    _exactly_as_onnxruntime("Mod", {"x": x, "y": y}, {"fmod": fmod}, opset=13)


def test_float_mod_with_fmod_0_stays_opaque():
    """ONNX allows fmod=0 for integers only (onnxruntime refuses floats): no rule for it."""
    from tessera.fission import fission
    from tessera.frontend import load
    from opcheck import build_model

    x = rand(3, 4, seed=76)
    m = build_model("Mod", {"x": x, "y": Const(np.float32(2.0))}, {"fmod": 0}, opset=13)
    res = fission(load(m).graph)
    assert [o.op_type for o in res.opaque] == ["Mod"] and "fmod=0" in str(res.opaque[0].reason)


@pytest.mark.parametrize("alpha", [None, 1.7, -0.5])
def test_swish(alpha):
    check_op("Swish", {"x": _with_special(118, 4, 9)}, {} if alpha is None else {"alpha": alpha}, opset=24)
