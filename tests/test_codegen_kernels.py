"""Every generated kernel form against the float64 reference, under Triton's interpreter.

Each case turns a small model's whole primitive graph into one Triton kernel,
so the kernel form is exercised exactly: elementwise chains, layout chains,
softmax, layer/instance/group norm, pooling, concat/split, pad, resize and
gather, on shapes that are not powers of two (primes among them), with the
default schedule and with the other schedule kinds.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from kernelcheck import check_kernel, one_kernel, run_kernel
from onnx import helper
from opcheck import Const, build_model, graph_model, rand

from tessera.codegen.kernels import Schedule, schedules
from tessera.codegen.triton_ops import Unsupported
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp

I64 = np.int64


def feeds_of(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if not isinstance(v, Const)}


def check(op: str, inputs: dict, attrs: dict | None = None, opset: int = 20, n_outputs: int = 1,
          schedule: Schedule | None = None):
    return check_kernel(build_model(op, inputs, attrs, opset=opset, n_outputs=n_outputs), feeds_of(inputs), schedule)


# ---- elementwise chains ------------------------------------------------------------------
@pytest.mark.parametrize("op,attrs,opset", [
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20), ("HardSwish", {}, 14), ("Tanh", {}, 13),
    ("LeakyRelu", {"alpha": 0.1}, 16), ("Softplus", {}, 1), ("Erf", {}, 13), ("Sigmoid", {}, 13), ("HardSigmoid", {}, 6),
])
def test_unary_chains(op, attrs, opset):
    check(op, {"x": rand(3, 37, seed=1, lo=-4, hi=4)}, attrs, opset)


@pytest.mark.parametrize("op,attrs,opset", [
    ("Mish", {}, 18), ("Elu", {"alpha": 0.5}, 6), ("Selu", {}, 6), ("Celu", {"alpha": 2.0}, 12), ("Softsign", {}, 1),
    ("ThresholdedRelu", {}, 10), ("Shrink", {"bias": 0.2}, 9), ("Sign", {}, 9),
])
def test_session_50_activations_in_one_kernel(op, attrs, opset):
    """The activations added in session 50, generated, on values from -30 to 30 and NaN."""
    x = rand(3, 37, seed=5, lo=-30, hi=30)
    x[0, :4] = [np.nan, 0.0, -1e-7, 1e-7]
    check(op, {"x": x}, attrs, opset)


@pytest.mark.parametrize("op", ["Sin", "Cos", "Tan"])
def test_trigonometry_in_one_kernel(op):
    """Near zero and far out: a rotary table's angles reach thousands of radians, where an
    approximation made for small angles would be far off."""
    x = np.concatenate([rand(2, 37, seed=6, lo=-4, hi=4), rand(2, 37, seed=7, lo=-1e4, hi=1e4)])
    x[0, :3] = [0.0, 1e-7, np.pi / 2]
    check(op, {"x": x}, opset=7)


_EDGES = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 0.5, -0.5, 2.5, -2.5, 0.49999997, -0.49999997,
                   8388607.5, -8388607.5, 1e30, -0.3, 0.3, -1e-30, 7.0], np.float32)


def _exact(model, feeds):
    """The kernel's values equal the reference interpreter's exactly, NaN where it has NaN and zeros
    signed as its. A NaN's own sign is not compared: a GPU's NaN is canonical (positive), x86's default
    NaN negative, and -floor(-NaN) flips whichever it got."""
    graph = fission(load(model).graph).graph
    ks = one_kernel(graph)
    got = run_kernel(graph, ks, feeds)[graph.outputs[0]]
    ref = interp.run(graph, dict(feeds))[graph.outputs[0]]
    np.testing.assert_array_equal(got, ref, err_msg=ks.source)
    num = ~np.isnan(ref) if ref.dtype.kind == "f" else np.ones(ref.shape, bool)
    assert (np.signbit(got) == np.signbit(ref))[num].all(), ks.source


@pytest.mark.parametrize("op,opset", [("Floor", 13), ("Ceil", 13), ("Round", 11), ("Neg", 13)])
def test_rounding_and_negation_in_one_kernel_are_exact(op, opset):
    """Neg too: Triton 3.6 negated a float as 0 - x, so -(0.0) was +0.0 and ceil(-0.3) +0.0 on the GPU."""
    x = np.concatenate([_EDGES, rand(40, seed=8, lo=-6, hi=6)]).reshape(2, -1)
    _exact(build_model(op, {"x": x}, opset=opset), {"x": x})


@pytest.mark.parametrize("fmod,dtype", [(0, np.int64), (1, np.int64), (0, np.int32)])
def test_integer_mod_in_one_kernel_is_exact(fmod, dtype):
    """C's remainder (fmod=1) and Python's (fmod=0), against a broadcast divisor of both signs."""
    rng = np.random.default_rng(9)
    x = rng.integers(-40, 40, (5, 8)).astype(dtype)
    y = (rng.integers(1, 7, (8,)) * np.array([1, -1] * 4)).astype(dtype)
    _exact(build_model("Mod", {"x": x, "y": y}, {"fmod": fmod}, opset=13), {"x": x, "y": y})


def test_float_mod_runs_in_torch_exactly():
    """A float remainder is no Triton kernel: the GPU's frem computes x - trunc(x / y) * y, wrong once
    the quotient passes float32's precision (on the H200, 8388607.5 % -1e-3 gave 0.1256 for 5.6e-4).
    torch.fmod runs it, exactly, on either device."""
    import tessera

    x = np.concatenate([_EDGES, rand(22, seed=10, lo=-50, hi=50)]).reshape(5, 8)
    y = np.array([3.0, -3.0, 0.7, -1e-3, 2.5, -0.5, 1e-30, 7.0], np.float32)
    model = build_model("Mod", {"x": x, "y": y}, {"fmod": 1}, opset=13)
    with pytest.raises(Unsupported, match="float remainder"):
        one_kernel(fission(load(model).graph).graph)
    run = tessera.compile(model, tessera.CompileOptions(cost="analytical"))
    got = run.run(x=x, y=y)[run.output_names[0]].cpu().numpy()
    with np.errstate(invalid="ignore"):  # fmod(inf, y) is NaN, as meant
        want = np.fmod(x, y)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("p", [3.0, 2.0, 0.5, -1.0, 2.5, 0.0, 4.0, -3.0])
def test_pow_by_a_scalar_constant(p):
    """A one-element constant is a literal in the source: special exponents become products or
    roots, others keep e**(y ln|x|) with its sign rules (negative bases, 2.5: NaN as the reference)."""
    x = rand(4, 33, seed=4, lo=0.25 if p in (0.5, 2.5) else -3, hi=3)
    ks = check("Pow", {"x": x, "p": Const(np.array(p, np.float32))})
    assert ks.source.count("tl.load(") == 1  # x alone: the exponent is not read


def test_tanh_saturates_and_keeps_its_sign():
    # 1 - 2 / (1 + e**2x): e**2x overflows to inf (tanh 1) or underflows to 0 (tanh -1).
    x = np.array([[-100.0, -20.0, -3.0, -0.5, -1e-3, 0.0, 1e-3, 0.5, 3.0, 20.0, 100.0]], np.float32)
    check("Tanh", {"x": x}, opset=13)


def test_binary_broadcast_chain_with_where_and_pow():
    x, y = rand(2, 1, 13, seed=2), rand(7, 1, seed=3, lo=0.5, hi=2)
    m = graph_model([
        helper.make_node("Add", ["x", "y"], ["s"]),
        helper.make_node("Greater", ["s", "y"], ["c"]),
        helper.make_node("Abs", ["s"], ["a"]),
        helper.make_node("Pow", ["a", "y"], ["p"]),
        helper.make_node("Where", ["c", "p", "s"], ["w"]),
        helper.make_node("Max", ["w", "x"], ["out"]),
    ], {"x": x, "y": y}, ["out", "c"])
    check_kernel(m, {"x": x, "y": y})


def test_casts_round_and_truncate():
    x = rand(5, 11, seed=4, lo=-50, hi=50)
    m = graph_model([
        helper.make_node("Cast", ["x"], ["h"], to=onnx.TensorProto.FLOAT16),
        helper.make_node("Cast", ["x"], ["i"], to=onnx.TensorProto.INT64),
        helper.make_node("Cast", ["i"], ["f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Cast", ["h"], ["g"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Sub", ["g", "f"], ["out"]),
    ], {"x": x}, ["out", "i", "h"])
    check_kernel(m, {"x": x}, exact=False)  # the reference rounds to float16 too


# ---- layout chains -----------------------------------------------------------------------
def test_transpose_reshape_slice_chain():
    x = rand(3, 5, 7, 2, seed=5)
    m = graph_model([
        helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 3, 1]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Relu", ["s"], ["out"]),
    ], {"x": x, "shape": Const(np.array([7, 6, 5], I64)), "starts": Const(np.array([-1, 1], I64)),
        "ends": Const(np.array([-100, 6], I64)), "axes": Const(np.array([0, 1], I64)),
        "steps": Const(np.array([-2, 2], I64))}, ["out"])
    check_kernel(m, {"x": x})


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_and_split(axis):
    a, b = rand(3, 5, 7, seed=6), rand(3, 5, 7, seed=7)
    parts = [[1, 2, 2], [2, 3, 2], [2, 3, 1, 3]][axis]
    a = a[tuple(slice(0, 2) if d == axis else slice(None) for d in range(3))]
    m = graph_model([
        helper.make_node("Concat", ["a", "b"], ["c"], axis=axis),
        helper.make_node("Split", ["c", "split"], [f"o{i}" for i in range(len(parts))], axis=axis),
    ], {"a": a, "b": b, "split": Const(np.array(parts, I64))}, [f"o{i}" for i in range(len(parts))])
    ks = check_kernel(m, {"a": a, "b": b})
    assert len(ks.outputs) == len(parts)  # outputs of different sizes in one pointwise grid


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    x = rand(2, 5, 7, seed=8)
    pads = Const(np.array([0, 2, 1, 1, 3, 2], I64))
    check("Pad", {"x": x, "pads": pads, "value": Const(np.array(1.5, np.float32))} if mode == "constant"
          else {"x": x, "pads": pads}, {"mode": mode}, opset=13)


@pytest.mark.parametrize("axis", [0, 1])
def test_gather_negative_indices(axis):
    x = rand(5, 7, 3, seed=9)
    idx = np.array([[0, -1, 2], [4, -5, 1]], I64)
    check_kernel(build_model("Gather", {"x": x, "i": idx}, {"axis": axis}, opset=13), {"x": x, "i": idx})


def test_gather_elements():
    x = rand(4, 6, seed=10)
    idx = np.array([[0, -1, 3], [5, 2, -6], [1, 1, 1]], I64)
    check_kernel(build_model("GatherElements", {"x": x, "i": idx}, {"axis": 1}, opset=13), {"x": x, "i": idx})


@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum_one_kernel(reverse):
    """The running sum's mask, broadcast and reduction in one kernel; an integer one too (RoBERTa's
    position ids: a running sum of the int64 padding mask)."""
    check("CumSum", {"x": rand(3, 9, 5, seed=12), "axis": Const(np.array(1, I64))}, {"reverse": reverse}, opset=14)
    check("CumSum", {"x": rand(2, 11, seed=13), "axis": Const(np.array(-1, I64))}, {"exclusive": 1, "reverse": reverse},
          opset=14)
    xi = np.random.default_rng(14).integers(-3, 9, (2, 37)).astype(I64)
    _exact(build_model("CumSum", {"x": xi, "axis": Const(np.array(1, I64))}, {"reverse": reverse}, opset=14), {"x": xi})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8])
def test_integer_reductions_in_one_kernel(op, dtype):
    """Integers accumulate in int64 from their type's extremes: rows holding the type's least and greatest
    values (an identity of -inf cast to int64 would be wrong there), a row longer than a block."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(15)
    x = rng.integers(max(info.min, -50), min(info.max, 50), (3, 1100)).astype(dtype)
    x[0, :] = info.min if op == "ReduceMax" else info.max if op == "ReduceMin" else x[0, :]
    x[1, 5] = info.max if op == "ReduceMax" else info.min if op == "ReduceMin" else x[1, 5]
    axes = {"axes": [1]} if op != "ReduceSum" else {}
    inputs = {"x": x, **({"axes": Const(np.array([1], I64))} if op == "ReduceSum" else {})}
    _exact(build_model(op, inputs, axes, opset=13), {"x": x})


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_in_one_kernel(op):
    """The extreme, then the least index that holds it, an int64 reduction, in one kernel (ties first)."""
    x = np.round(rand(4, 301, seed=16, lo=-9, hi=9))
    _exact(build_model(op, {"x": x}, {"axis": 1, "keepdims": 0}, opset=13), {"x": x})


@pytest.mark.parametrize("block,strides,pads", [([2, 2], [2, 2], [0, 0, 0, 0]), ([3, 3], [2, 1], [1, 0, 1, 1])])
def test_col2im_one_kernel(block, strides, pads):
    """Blocks folded back into an image: a transpose where they tile it, else planes spread by the stride,
    moved to their offsets and added, all in one kernel."""
    image = [6, 8]
    blocks = [(image[i] + pads[i] + pads[2 + i] - block[i]) // strides[i] + 1 for i in range(2)]
    x = rand(1, 2 * block[0] * block[1], blocks[0] * blocks[1], seed=17)
    check("Col2Im", {"x": x, "img": Const(np.array(image, I64)), "blk": Const(np.array(block, I64))},
          {"strides": strides, "pads": pads}, opset=18)


@pytest.mark.parametrize("op,inputs,attrs,opset", [
    ("RMSNormalization", {"x": rand(4, 37, seed=18), "s": Const(rand(37, seed=19))}, {}, 23),
    ("LRN", {"x": rand(2, 6, 3, 5, seed=20)}, {"size": 5}, 13),
    ("Trilu", {"x": rand(3, 7, 6, seed=21), "k": Const(np.array(-1, I64))}, {"upper": 0}, 14),
    ("Hardmax", {"x": np.round(rand(5, 33, seed=22))}, {}, 13),
    ("MeanVarianceNormalization", {"x": rand(2, 3, 5, 4, seed=23)}, {"axes": [2, 3]}, 13),
    ("Swish", {"x": rand(3, 37, seed=24, lo=-8, hi=8)}, {"alpha": 1.5}, 24),
])
def test_session_51_normalizations_in_one_kernel(op, inputs, attrs, opset):
    check(op, inputs, attrs, opset=opset)


def test_one_hot_one_kernel():
    idx = np.array([[1, 3, -1], [0, 5, -5]], I64)
    model = build_model("OneHot", {"i": idx, "d": Const(np.array(4, I64)), "v": Const(np.array([0.5, 2.0], np.float32))},
                        {"axis": 1}, opset=11)
    check_kernel(model, {"i": idx})


@pytest.mark.parametrize("bd", [0, 1])
def test_gather_nd_computed_indices(bd):
    """GatherND's index tuples combined into positions (negatives wrapped first), then one gather: all
    in one kernel."""
    x = rand(3, 5, 4, seed=11)
    idx = np.array([[[1, -1], [0, 2], [-3, 0]], [[2, 3], [-1, -4], [0, 0]], [[1, 1], [2, -2], [0, 3]]], I64)
    idx = idx[:, :, 1:] if bd else idx  # batch_dims 1: one index per tuple into the 5-long axis
    check_kernel(build_model("GatherND", {"x": x, "i": idx}, {"batch_dims": bd}, opset=13), {"x": x, "i": idx})


@pytest.mark.parametrize("attrs", [
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "cubic", "coordinate_transformation_mode": "half_pixel"},
    {"mode": "cubic", "coordinate_transformation_mode": "align_corners", "cubic_coeff_a": -0.5, "exclude_outside": 1},
])
def test_resize(attrs):
    x = rand(1, 3, 5, 7, seed=11)
    inputs = {"x": x, "roi": Const(np.zeros(0, np.float32)), "scales": Const(np.array([1, 1, 2.0, 1.5], np.float32))}
    check("Resize", inputs, attrs, opset=13)


# ---- reductions ----------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax_any_axis(axis):
    check("Softmax", {"x": rand(3, 7, 13, seed=12)}, {"axis": axis}, opset=13)


def test_layernorm():
    check("LayerNormalization", {"x": rand(5, 37, seed=13), "s": Const(rand(37, seed=14)),
                                 "b": Const(rand(37, seed=15))}, {"axis": -1, "epsilon": 1e-5}, opset=17)


def test_instance_norm():
    check("InstanceNormalization", {"x": rand(2, 3, 7, 5, seed=16), "s": Const(rand(3, seed=17)),
                                    "b": Const(rand(3, seed=18))}, {"epsilon": 1e-5}, opset=6)


def test_group_norm():
    check("GroupNormalization", {"x": rand(2, 6, 5, seed=19), "s": Const(rand(6, seed=20)),
                                 "b": Const(rand(6, seed=21))}, {"epsilon": 1e-5, "num_groups": 3}, opset=21)


def test_reduce_over_leading_and_middle_axes():
    check("ReduceMax", {"x": rand(5, 3, 7, seed=22), "axes": Const(np.array([0, 2], I64))}, {"keepdims": 0}, opset=18)


# Looped schedules stream a row in chunks: rows longer than the block, not a multiple of it.
@pytest.mark.parametrize("op,inputs,attrs,opset", [
    ("Softmax", {"x": rand(3, 1031, seed=23)}, {"axis": -1}, 13),
    ("LayerNormalization", {"x": rand(2, 1201, seed=24), "s": Const(rand(1201, seed=25)),
                            "b": Const(rand(1201, seed=26))}, {"axis": -1}, 17),
    ("InstanceNormalization", {"x": rand(1, 2, 31, 37, seed=27), "s": Const(rand(2, seed=28)),
                               "b": Const(rand(2, seed=29))}, {}, 6),
])
def test_looped_reductions(op, inputs, attrs, opset):
    graph = fission(load(build_model(op, inputs, attrs, opset=opset)).graph).graph
    looped = [s for s in schedules(3, 1031) if not s.persistent]
    assert looped, "rows longer than a block have a looped schedule"
    check(op, inputs, attrs, opset, schedule=Schedule(2, 512, 4, False))
    check(op, inputs, attrs, opset, schedule=Schedule(1, 256, 4, False))
    assert "for r" in one_kernel(graph, Schedule(1, 256, 4, False)).source


def test_persistent_block_shorter_than_row_is_unsupported():
    graph = fission(load(build_model("Softmax", {"x": rand(3, 100)}, {"axis": -1}, opset=13)).graph).graph
    with pytest.raises(Unsupported, match="persistent"):
        one_kernel(graph, Schedule(1, 64, 4, True))


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1, 1), (3, 1), (2, 1, 3)])
def test_literal_only_primitive_in_a_row_reduction(shape):
    """BatchNorm's variance + epsilon has literals only: Triton gets it as a 0-d tensor, of no
    rank, so with a 1x1 input (its one element a scalar load) the normalized value is a scalar too
    and its store broadcasts it to the 2-D block (a rank-1 tl.full([1], ...) could not be)."""
    x, c = rand(*shape, seed=1), shape[1]
    m = graph_model([
        helper.make_node("BatchNormalization", ["x", "s", "b", "mu", "var"], ["y"], epsilon=1e-5),
        helper.make_node("Softmax", ["y"], ["out"], axis=-1),
    ], {"x": x, "s": Const(rand(c, seed=2)), "b": Const(rand(c, seed=3)), "mu": Const(rand(c, seed=4)),
        "var": Const(rand(c, seed=5, lo=0.5, hi=2))}, ["out", "y"], opset=15)
    ks = check_kernel(m, {"x": x})
    assert "row reduction" in ks.source and "tl.full([1]," not in ks.source


@pytest.mark.parametrize("shape", [(1, 1), (3, 1)])
def test_infinite_exponent_in_a_row_reduction(shape):
    # x ** inf keeps e**(y ln|x|), its literal exponent a 0-d tensor: with a 1x1 input the power is
    # a scalar, stored as the second output (rank 1 before: "Cannot broadcast, rank mismatch").
    x = rand(*shape, seed=6, lo=0.25, hi=0.75)
    m = graph_model([
        helper.make_node("Pow", ["x", "p"], ["y"]),
        helper.make_node("Softmax", ["y"], ["out"], axis=-1),
    ], {"x": x, "p": Const(np.array(np.inf, np.float32))}, ["out", "y"], opset=13)
    ks = check_kernel(m, {"x": x})
    assert "row reduction" in ks.source and "tl.full([1]," not in ks.source


# ---- pooling ---------------------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "dilations": [2, 1], "pads": [0, 1, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [3, 3]},
])
def test_max_pool(attrs):
    check("MaxPool", {"x": rand(1, 3, 11, 13, seed=30)}, attrs, opset=12)


@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(include_pad):
    check("AveragePool", {"x": rand(2, 3, 7, 11, seed=31)},
          {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "count_include_pad": include_pad}, opset=11)


def test_global_average_pool_is_a_row_reduction():
    ks = check("GlobalAveragePool", {"x": rand(1, 5, 7, 9, seed=32)}, opset=1)
    assert ks.rnumel == 63


def test_pool_then_elementwise_in_one_kernel():
    x = rand(1, 2, 9, 9, seed=33)
    m = graph_model([
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["p"], ["out"]),
    ], {"x": x}, ["out"], opset=12)
    check_kernel(m, {"x": x})


# ---- every schedule of the space runs ------------------------------------------------------
def test_every_default_space_schedule_is_correct_for_softmax():
    inputs = {"x": rand(6, 37, seed=34)}
    for s in schedules(6, 37):
        check("Softmax", inputs, {"axis": -1}, 13, schedule=s)


def test_source_is_readable():
    ks = check("Softmax", {"x": rand(2, 5, seed=35)}, {"axis": -1}, 13)
    assert "# primitives: softmax_0/reduce_max (reduce_max)" in ks.source
    assert "# in0: x float32[2x5]" in ks.source
    assert ks.name == "k0_test"


def test_unsupported_says_why():
    graph = fission(load(build_model("Div", {"a": np.arange(1, 7, dtype=I64), "b": np.full(6, 4, I64)})).graph).graph
    with pytest.raises(Unsupported, match="integer division"):
        one_kernel(graph)


# A reduction kernel may also write a per-row plane of another size (candy's norm -> relu -> pad).
@pytest.mark.parametrize("schedule", [None, Schedule(2, 512, 4, False), Schedule(1, 64, 4, False)])
def test_norm_relu_pad_in_one_reduction_kernel(schedule):
    x = rand(1, 3, 9, 7, seed=36)
    m = graph_model([
        helper.make_node("InstanceNormalization", ["x", "s", "b"], ["n"], epsilon=1e-5),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["out"], mode="reflect"),
    ], {"x": x, "s": Const(rand(3, seed=37)), "b": Const(rand(3, seed=38)),
        "pads": Const(np.array([0, 0, 2, 1, 0, 0, 2, 1], I64))}, ["out", "r"], opset=13)
    ks = check_kernel(m, {"x": x}, schedule)
    assert ks.rnumel == 63 and "for r" in ks.source


# ---- tiled pointwise (transposing kernels) ------------------------------------------------
def _transpose_add_model(shape, perm, seed=3):
    x = rand(*shape, seed=seed)
    out_shape = [shape[p] for p in perm]
    b = rand(out_shape[-1], seed=seed + 1)
    m = graph_model([helper.make_node("Transpose", ["x"], ["t"], perm=perm),
                     helper.make_node("Add", ["t", "b"], ["s"]), helper.make_node("Relu", ["s"], ["out"])],
                    {"x": x, "b": Const(b)}, ["out"])
    return m, {"x": x}


@pytest.mark.parametrize("shape,perm", [((1, 13, 9, 7), [0, 2, 3, 1]), ((2, 37, 19), [0, 2, 1]), ((5, 3), [1, 0])])
@pytest.mark.parametrize("schedule", [Schedule(8, 4, 4, False), Schedule(16, 64, 4, True), Schedule(2, 2, 2, False)])
def test_tiled_transposes(shape, perm, schedule):
    # Rows of the output against columns in 2-D blocks: remainders on both axes are masked, and
    # one tile a program (its grid covers every tile) or whole rows give the float64 reference's result.
    m, feeds = _transpose_add_model(shape, perm)
    ks = check_kernel(m, feeds, schedule)
    assert "tiled pointwise" in ks.source and ks.rnumel == shape[perm[-1]]
    assert "for r" not in ks.source
    col_blocks = 1 if schedule.persistent else -(-ks.rnumel // schedule.rblock)
    assert ks.grid == -(-ks.xnumel // schedule.xblock) * col_blocks


@pytest.mark.parametrize("schedule", [Schedule(4, 8, 4, False), Schedule(8, 16, 4, True), Schedule(2, 2, 2, False)])
def test_a_transposed_axis_split_by_a_reshape_is_one_column_group(schedule):
    # [N, HW, C] -> [N, C, HW] -> [N, C, H, W] (segformer_b0's decoder): a row is one channel and its
    # columns are H x W, so the input is read along the rows and the output written along the columns.
    from tessera.codegen.kernels import tile_shape

    x = rand(2, 15, 6, seed=41)
    m = graph_model([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
                     helper.make_node("Reshape", ["t", "s"], ["r"]), helper.make_node("Add", ["r", "b"], ["out"])],
                    {"x": x, "s": Const(np.array([2, 6, 3, 5], I64)), "b": Const(rand(5, seed=42))}, ["out"])
    g = fission(load(m).graph).graph
    assert tile_shape(g, g.nodes, list(g.outputs)) == (2 * 6, 15)
    ks = check_kernel(m, {"x": x}, schedule)
    assert "tiled pointwise" in ks.source and ks.rnumel == 15


def test_tiled_schedules_only_for_transposing_kernels():
    from tessera.codegen.kernels import tile_shape

    m, _ = _transpose_add_model((1, 8, 4, 6), [0, 2, 3, 1])
    g = fission(load(m).graph).graph
    assert tile_shape(g, g.nodes, list(g.outputs)) == (4 * 6, 8)
    assert Schedule(32, 8, 4, True) in schedules(24 * 8, 1, tile=(24, 8))
    assert schedules(24 * 8, 1) == schedules(24 * 8, 1, tile=(24, 8))[:8]  # flat first: the default stays
    x = rand(4, 6)
    plain = fission(load(build_model("Relu", {"x": x})).graph).graph
    assert tile_shape(plain, plain.nodes, list(plain.outputs)) is None
    with pytest.raises(Unsupported, match="tiled"):
        one_kernel(plain, Schedule(4, 4, 4, False))
    with pytest.raises(Unsupported, match="narrower"):
        one_kernel(g, Schedule(4, 4, 4, True))


# ---- division by a divisor invariant in the inner loops --------------------------------------
def test_row_invariant_divisor_is_inverted_once():
    # Softmax divides each element by its row's sum: one reciprocal per row, a multiply per element.
    ks = check("Softmax", {"x": rand(4, 37, seed=37)}, {"axis": -1}, 13)
    assert "1.0 / r" in ks.source and " / r" not in ks.source.replace("1.0 / r", "")


def test_elementwise_divisor_keeps_the_division():
    ks = check("Div", {"a": rand(3, 5, seed=38), "b": rand(3, 5, seed=39) + 3.0}, {}, 13)
    assert "1.0 /" not in ks.source and " / " in ks.source


@pytest.mark.parametrize("value, form", [(8.0, "* 0.125"), (0.0, "/ 0.0"), (3.0, "* 0.333")])
def test_literal_divisor(value, form):
    # A nonzero finite constant becomes a product; x / 0 stays a division (inf, -inf and NaN kept).
    from tessera.codegen.triton_ops import Val, elementwise
    from tessera.ir.dtype import DType
    from tessera.ir.prims import Prim
    x = Val("x", DType.FLOAT32, frozenset({"m"}))
    expr = elementwise(Prim.DIV, [x, Val(repr(value), DType.FLOAT32, literal=value)], DType.FLOAT32, {},
                       lambda e, d: "t")
    assert form in expr
