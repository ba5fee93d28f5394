"""Fission rules of ops/layout.py and ops/placement.py against onnxruntime, at every opset variant."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from opcheck import Const, build_model, check_op, rand

from tessera.fission import fission
from tessera.errors import TesseraError
from tessera.frontend import load

I64 = np.int64
BIG = np.iinfo(np.int64).max
LAYOUT_PRIMS = {"transpose", "reshape", "slice", "pad", "concat", "gather", "gather_elements", "broadcast"}


def _ops(pg) -> list[str]:
    return [n.op for n in pg.nodes]


def _only_layout(pg) -> None:
    assert set(_ops(pg)) <= LAYOUT_PRIMS, _ops(pg)


def _opaque_reasons(op: str, inputs: dict, attrs: dict | None = None, opset: int = 20, n_outputs: int = 1) -> list[str]:
    model = build_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset)
    return [o.reason for o in fission(load(model).graph).opaque]


def _ints(*v: int) -> Const:
    return Const(np.array(v, dtype=I64))


def _omit() -> Const:
    # build_model drops inputs named "__omit*"; a Const keeps it out of the feeds.
    return Const(np.zeros(0, dtype=I64))


def _id(name: str, i: int, value) -> str:
    """The id pytest gives the i-th value of a list parameter `name` ("None" for None)."""
    return "None" if value is None else f"{name}{i}"


# ---- Transpose ------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("shape,perm", [
    ((2, 3, 5), None),
    ((2, 3, 5), [2, 0, 1]),
    ((7, 1, 3, 2), [0, 3, 1, 2]),
    ((3, 7), [1, 0]),
    ((2, 3, 5, 7, 1), [4, 2, 0, 3, 1]),
])
def test_transpose(shape, perm, opset):
    attrs = {} if perm is None else {"perm": perm}
    pg = check_op("Transpose", {"x": rand(*shape, seed=1)}, attrs, opset=opset, expect_prims=["transpose"])
    _only_layout(pg)


def test_transpose_identity_emits_nothing():
    pg = check_op("Transpose", {"x": rand(5, seed=2)}, {}, opset=13)
    assert "transpose" not in _ops(pg)


# ---- Reshape, Flatten, Squeeze, Unsqueeze ------------------------------------------------
@pytest.mark.parametrize("opset", [5, 13, 14, 19])
@pytest.mark.parametrize("shape,target", [
    ((2, 3, 5), (6, 5)),
    ((2, 3, 5), (0, -1)),
    ((2, 3, 5), (-1,)),
    ((2, 3, 5), (0, 0, 5, 1)),
    ((7, 11), (11, -1, 1)),
    ((1, 13), (13,)),
])
def test_reshape(shape, target, opset):
    pg = check_op("Reshape", {"x": rand(*shape, seed=3), "shape": _ints(*target)}, opset=opset,
                  expect_prims=["reshape"])
    assert _ops(pg) == ["reshape"]


def test_reshape_allowzero_without_zeros():
    check_op("Reshape", {"x": rand(2, 3, 5, seed=4), "shape": _ints(5, -1, 2)}, {"allowzero": 1}, opset=14)




# Negative axes arrive in opset 11: those combinations are not generated below it.
FLATTEN_CASES = [
    pytest.param(axis, opset, id=f"{axis}-{opset}")
    for opset, axis in itertools.product([9, 11, 13], [0, 1, 2, 3, 4, -1, -3])
    if not (axis < 0 and opset < 11)
]


@pytest.mark.parametrize("axis,opset", FLATTEN_CASES)
def test_flatten(axis, opset):
    check_op("Flatten", {"x": rand(2, 3, 5, 7, seed=6)}, {"axis": axis}, opset=opset, expect_prims=["reshape"])


@pytest.mark.parametrize("axes", [None, [1], [-1], [1, -1], [3, 1]])
def test_squeeze11(axes):
    attrs = {} if axes is None else {"axes": axes}
    check_op("Squeeze", {"x": rand(5, 1, 3, 1, seed=7)}, attrs, opset=11, expect_prims=["reshape"])


@pytest.mark.parametrize("axes", [None, [1], [-1, 1]])
def test_squeeze13(axes):
    inputs = {"x": rand(5, 1, 3, 1, seed=8)}
    if axes is not None:
        inputs["axes"] = _ints(*axes)
    check_op("Squeeze", inputs, opset=13, expect_prims=["reshape"])


@pytest.mark.parametrize("axes", [[0], [-1], [1, 3], [0, -1], [4, 0, 2]])
def test_unsqueeze(axes):
    check_op("Unsqueeze", {"x": rand(3, 5, seed=9)}, {"axes": axes}, opset=11, expect_prims=["reshape"])
    check_op("Unsqueeze", {"x": rand(3, 5, seed=9), "axes": _ints(*axes)}, opset=13, expect_prims=["reshape"])


# ---- Concat, Split -----------------------------------------------------------------------
# Negative axes arrive in opset 11: those combinations are not generated below it.
CONCAT_CASES = [
    pytest.param(axis, opset, id=f"{axis}-{opset}")
    for opset, axis in itertools.product([4, 11, 13], [0, 1, 2, -1, -2])
    if not (axis < 0 and opset < 11)
]


@pytest.mark.parametrize("axis,opset", CONCAT_CASES)
def test_concat(axis, opset):
    base = [2, 3, 5]
    shapes = []
    for n in (1, 4, 3):
        s = list(base)
        s[axis] = n
        shapes.append(s)
    inputs = {"a": rand(*shapes[0], seed=10), "b": rand(*shapes[1], seed=11), "c": Const(rand(*shapes[2], seed=12))}
    pg = check_op("Concat", inputs, {"axis": axis}, opset=opset, expect_prims=["concat"])
    _only_layout(pg)


def test_concat_single_input():
    check_op("Concat", {"a": rand(3, 7, seed=13)}, {"axis": 1}, opset=13)


@pytest.mark.parametrize("axis,split", [(1, [2, 3, 2]), (-1, [1, 4]), (0, None), (2, [5])])
def test_split_attribute(axis, split):
    shape = (3, 7, 5)
    n = len(split) if split else 3
    attrs = {"axis": axis} | ({"split": split} if split else {})
    pg = check_op("Split", {"x": rand(*shape, seed=14)}, attrs, n_outputs=n, opset=11)
    assert set(_ops(pg)) <= {"slice", "reshape"}


# Opset 18 needs split or num_outputs, so the case without a split input is not generated
# there (test_split_num_outputs covers num_outputs).
SPLIT_INPUT_CASES = [
    pytest.param(axis, split, opset, id=f"{axis}-{_id('split', i, split)}-{opset}")
    for opset, (i, (axis, split)) in itertools.product([13, 18], enumerate([(1, [2, 3, 2]), (-2, [6, 1]), (0, None)]))
    if not (opset >= 18 and split is None)
]


@pytest.mark.parametrize("axis,split,opset", SPLIT_INPUT_CASES)
def test_split_input(axis, split, opset):
    inputs = {"x": rand(3, 7, 5, seed=15)}
    if split:
        inputs["split"] = _ints(*split)
    n = len(split) if split else 3
    pg = check_op("Split", inputs, {"axis": axis}, n_outputs=n, opset=opset, expect_prims=["slice"])
    assert _ops(pg).count("slice") == n


@pytest.mark.parametrize("dim,n", [(7, 3), (9, 3), (5, 2), (13, 4)])
def test_split_num_outputs(dim, n):
    pg = check_op("Split", {"x": rand(2, dim, seed=16)}, {"axis": -1, "num_outputs": n}, n_outputs=n, opset=18)
    assert _ops(pg).count("slice") == n


# ---- Slice -----------------------------------------------------------------------------
SLICES = [  # starts, ends, axes (None: omitted), steps (None: omitted)
    ([1], [4], None, None),
    ([0, 1], [2, 5], [0, 1], None),
    ([-3], [BIG], [1], None),  # ends past the dim clamp
    ([-100], [100], [2], None),  # starts before 0 clamp
    ([2, 1], [-1, -1], [-1, 0], None),  # negative axes and ends
    ([5], [0], [2], [-1]),  # backwards, end exclusive
    ([-1], [-BIG], [1], [-2]),  # backwards over the whole dim
    ([100], [-100], [2], [-3]),  # backwards, both clamped
    ([0, 0, 0], [BIG, BIG, BIG], [0, 1, 2], [2, 3, 4]),  # uneven strides
    ([1, 6], [3, 0], [0, 2], [1, -2]),
]


# Negative axes and steps arrive in opset 11: those slices are not generated below it.
SLICE_CASES = [
    pytest.param(starts, ends, axes, steps, opset,
                 id=f"starts{i}-ends{i}-{_id('axes', i, axes)}-{_id('steps', i, steps)}-{opset}")
    for opset, (i, (starts, ends, axes, steps)) in itertools.product([10, 11, 13], enumerate(SLICES))
    if not (opset < 11 and (any(a < 0 for a in axes or []) or steps and any(s < 0 for s in steps)))
]


@pytest.mark.parametrize("starts,ends,axes,steps,opset", SLICE_CASES)
def test_slice(starts, ends, axes, steps, opset):
    inputs = {"x": rand(3, 5, 7, seed=17), "starts": _ints(*starts), "ends": _ints(*ends)}
    if axes is not None:
        inputs["axes"] = _ints(*axes)
    elif steps is not None:
        inputs["__omit_axes"] = _omit()
    if steps is not None:
        inputs["steps"] = _ints(*steps)
    pg = check_op("Slice", inputs, opset=opset)
    # Clamping can make a slice the identity, which emits nothing (the output is a copy).
    assert _ops(pg) in (["slice"], ["reshape"])


# ONNX's Slice-1 shape inference (which the harness declares outputs with) gets
# unsorted axes wrong, so these list axes in order.
@pytest.mark.parametrize("starts,ends,axes", [([1], [4], None), ([0, -3], [2, 100], [0, 2]), ([2], [-1], [1])])
def test_slice1_attributes(starts, ends, axes):
    attrs = {"starts": starts, "ends": ends} | ({"axes": axes} if axes else {})
    check_op("Slice", {"x": rand(5, 6, 7, seed=18)}, attrs, opset=1, expect_prims=["slice"])


def test_slice_int32_data_and_indices():
    x = np.random.default_rng(19).integers(-50, 50, size=(4, 9)).astype(np.int32)
    check_op("Slice", {"x": x, "starts": Const(np.array([7], np.int32)), "ends": Const(np.array([1], np.int32)),
                       "axes": Const(np.array([1], np.int32)), "steps": Const(np.array([-3], np.int32))}, opset=13)


def test_slice_empty_is_opaque():
    inputs = {"x": rand(3, 5, seed=20), "starts": _ints(3), "ends": _ints(1), "axes": _ints(1)}
    assert "empty" in _opaque_reasons("Slice", inputs, opset=13)[0]


# ---- Pad ----------------------------------------------------------------------------------
PADS = [  # pads for a rank-3 input [3, 5, 7]: begins then ends
    [0, 1, 2, 0, 2, 1],
    [1, 0, 0, 2, 0, 3],
    [0, -1, 2, 0, 1, -2],  # crop the second dim's start, the third's end
    [0, 2, -3, 0, -2, 3],  # reflect pads count from the cropped tensor
    [-1, 0, 0, 0, 0, 0],
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PADS)
def test_pad11(pads, mode):
    inputs = {"x": rand(3, 5, 7, seed=21), "pads": _ints(*pads)}
    if mode == "constant":
        inputs["value"] = Const(np.array(1.5, np.float32))
    pg = check_op("Pad", inputs, {"mode": mode}, opset=11)
    _only_layout(pg)
    if any(p > 0 for p in pads):
        assert "pad" in _ops(pg)
    if any(p < 0 for p in pads):
        assert "slice" in _ops(pg)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad2_attributes(mode):
    attrs = {"pads": [0, 2, 1, 1, 3, 0], "mode": mode} | ({"value": -0.75} if mode == "constant" else {})
    check_op("Pad", {"x": rand(4, 5, 6, seed=22)}, attrs, opset=2, expect_prims=["pad"])


@pytest.mark.parametrize("opset", [18, 19])
@pytest.mark.parametrize("axes,pads", [([1], [2, 3]), ([-1, 0], [1, -1, 2, 0]), ([2, 1], [3, 0, -2, 1])])
def test_pad18_axes(axes, pads, opset):
    for mode in ("constant", "reflect", "edge"):
        inputs = {"x": rand(3, 5, 7, seed=23), "pads": _ints(*pads), "__omit_value": _omit(), "axes": _ints(*axes)}
        check_op("Pad", inputs, {"mode": mode}, opset=opset)


def test_pad_int32_constant():
    x = np.random.default_rng(24).integers(1, 9, size=(3, 4)).astype(np.int32)
    check_op("Pad", {"x": x, "pads": _ints(1, 0, 2, 3), "value": Const(np.array(-7, np.int32))}, opset=13,
             expect_prims=["pad"])


def test_pad_value_not_constant_is_opaque():
    inputs = {"x": rand(3, 5, seed=5), "pads": _ints(0, 1, 0, 2), "value": np.array(0.5, np.float32)}
    assert "constant" in _opaque_reasons("Pad", inputs, opset=13)[0]


def test_pad_wrap_is_opaque():
    inputs = {"x": rand(3, 5, seed=25), "pads": _ints(0, 1, 0, 2)}
    assert "wrap" in _opaque_reasons("Pad", inputs, {"mode": "wrap"}, opset=19)[0]


# ---- Expand, Tile --------------------------------------------------------------------------
@pytest.mark.parametrize("opset", [8, 13])
@pytest.mark.parametrize("shape,target", [
    ((3, 1), (2, 1, 4)),  # result has higher rank than both
    ((1, 5), (3, 1)),
    ((2, 3, 4), (4,)),  # target of lower rank
    ((7,), (3, 2, 7)),
    ((2, 1, 1), (2, 3, 5)),
    ((3, 5), (1, 1)),  # no growth: nothing but a reshape at most
])
def test_expand(shape, target, opset):
    pg = check_op("Expand", {"x": rand(*shape, seed=26), "shape": _ints(*target)}, opset=opset)
    assert set(_ops(pg)) <= {"reshape", "broadcast"}


@pytest.mark.parametrize("opset", [6, 13])
@pytest.mark.parametrize("shape,reps", [
    ((3, 5), (2, 1)),
    ((3, 5), (1, 3)),
    ((2, 3, 5), (2, 3, 2)),
    ((1, 7), (4, 2)),
    ((5,), (1,)),
])
def test_tile(shape, reps, opset):
    pg = check_op("Tile", {"x": rand(*shape, seed=27), "repeats": _ints(*reps)}, opset=opset)
    assert set(_ops(pg)) <= {"reshape", "broadcast"}
    if any(r > 1 for r in reps):
        assert "broadcast" in _ops(pg)


# ---- Gather, GatherElements ----------------------------------------------------------------
GATHERS = [  # axis, constant indices, the prims fission may emit
    (0, np.array(2), {"slice", "reshape"}),  # scalar: the dim disappears
    (1, np.array(-1), {"slice", "reshape"}),
    (-1, np.array([0, 2, 4]), {"slice"}),  # progression -> strided slice
    (1, np.array([4, 3, 2, 1, 0]), {"slice"}),  # reversed -> negative step
    (2, np.array([3, 0, 6, 6, 1]), {"gather"}),
    (2, np.array([[1, -2], [0, -7]]), {"gather", "reshape"}),
    (0, np.array([1, 1, 1]), {"slice", "broadcast", "reshape"}),  # one row repeated
]
# Negative indices and axes arrive in opset 11: those gathers are not generated below it.
GATHER_CONST_CASES = [
    pytest.param(axis, indices, prims, opset, id=f"{axis}-indices{i}-prims{i}-{opset}")
    for opset, (i, (axis, indices, prims)) in itertools.product([1, 11, 13], enumerate(GATHERS))
    if not (opset < 11 and ((indices < 0).any() or axis < 0))
]


@pytest.mark.parametrize("axis,indices,prims,opset", GATHER_CONST_CASES)
def test_gather_const(axis, indices, prims, opset):
    pg = check_op("Gather", {"x": rand(3, 5, 7, seed=28), "i": Const(indices.astype(I64))}, {"axis": axis},
                  opset=opset)
    assert set(_ops(pg)) <= prims, _ops(pg)


@pytest.mark.parametrize("axis,ishape", [(0, ()), (1, (4,)), (-1, (2, 3)), (2, ())])
def test_gather_graph_indices(axis, ishape):
    x = rand(3, 5, 7, seed=29)
    d = x.shape[axis]
    i = np.random.default_rng(30).integers(-d, d, size=ishape).astype(I64)
    pg = check_op("Gather", {"x": x, "i": i}, {"axis": axis}, opset=13, expect_prims=["gather"])
    _only_layout(pg)


def test_gather_int32_indices_and_int_data():
    x = np.random.default_rng(31).integers(-9, 9, size=(6, 4)).astype(I64)
    check_op("Gather", {"x": x, "i": Const(np.array([5, -6, 2], np.int32))}, {"axis": 0}, opset=13)
    check_op("Gather", {"x": x, "i": np.array([[3, 0], [-1, 2]], np.int32)}, {"axis": 0}, opset=13)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis,ishape", [(0, (2, 5, 7)), (1, (3, 4, 7)), (-1, (3, 5, 9)), (2, (1, 2, 3))])
@pytest.mark.parametrize("const", [False, True])
def test_gather_elements(axis, ishape, const, opset):
    x = rand(3, 5, 7, seed=32)
    d = x.shape[axis]
    i = np.random.default_rng(33).integers(-d, d, size=ishape).astype(I64)
    inputs = {"x": x, "i": Const(i) if const else i}
    check_op("GatherElements", inputs, {"axis": axis}, opset=opset, expect_prims=["gather_elements"])


# ---- GatherND ----------------------------------------------------------------------------------
GATHER_ND_CASES = [  # data shape, indices shape (last axis: the tuple), batch_dims
    ((4, 5, 6), (3, 1), 0),  # rows
    ((4, 5, 6), (2, 3, 2), 0),  # (row, column) pairs: vectors of 6
    ((4, 5, 6), (7, 3), 0),  # single elements
    ((4, 5, 6), (2,), 0),  # one tuple, no leading index axes
    ((6, 2, 24, 16), (1, 1), 0),  # Falcon's rotary tables (transformers 5, dynamo export)
    ((3, 5, 6), (3, 4, 1), 1),  # per batch entry
    ((2, 3, 5, 4), (2, 3, 2, 2), 2),
]


@pytest.mark.parametrize("const", [False, True])
@pytest.mark.parametrize("dshape,ishape,bd", GATHER_ND_CASES)
def test_gather_nd(dshape, ishape, bd, const):
    rng = np.random.default_rng(35)
    x = rand(*dshape, seed=36)
    dims = dshape[bd:bd + ishape[-1]]
    i = np.stack([rng.integers(-d, d, size=ishape[:-1]) for d in dims], axis=-1).astype(I64)
    check_op("GatherND", {"x": x, "i": Const(i) if const else i}, {"batch_dims": bd}, opset=13)


def test_gather_nd_int_data_and_opset_11():
    x = np.random.default_rng(37).integers(-9, 9, size=(5, 4)).astype(I64)
    i = np.array([[4, -1], [0, 2], [-5, 0]], I64)
    check_op("GatherND", {"x": x, "i": i}, opset=11)
    check_op("GatherND", {"x": rand(5, 4, seed=38), "i": Const(i)}, opset=11)


def test_gather_nd_out_of_range_constant_is_an_error():
    model = build_model("GatherND", {"x": rand(5, 4, seed=39), "i": Const(np.array([[5, 0]], I64))}, opset=13)
    with pytest.raises(TesseraError, match="indices out of range for extent 5"):
        fission(load(model).graph)


# ---- SpaceToDepth, DepthToSpace -----------------------------------------------------------
@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("shape,bs", [((1, 3, 4, 6), 2), ((2, 5, 9, 3), 3)])
def test_space_to_depth(shape, bs, opset):
    check_op("SpaceToDepth", {"x": rand(*shape, seed=34)}, {"blocksize": bs}, opset=opset, expect_prims=["transpose"])


# CRD arrives in opset 11: it is not generated below it (where the mode is DCR and not written).
DEPTH_TO_SPACE_CASES = [
    pytest.param(shape, bs, mode, opset, id=f"shape{i}-{bs}-{mode}-{opset}")
    for opset, mode, (i, (shape, bs)) in itertools.product(
        [1, 11, 13], ["DCR", "CRD"], enumerate([((1, 12, 2, 3), 2), ((2, 18, 3, 5), 3)]))
    if not (opset < 11 and mode == "CRD")
]


@pytest.mark.parametrize("shape,bs,mode,opset", DEPTH_TO_SPACE_CASES)
def test_depth_to_space(shape, bs, mode, opset):
    attrs = {"blocksize": bs} | ({"mode": mode} if opset >= 11 else {})
    check_op("DepthToSpace", {"x": rand(*shape, seed=35)}, attrs, opset=opset, expect_prims=["transpose"])


# ---- ScatterND, ScatterElements (constant indices) ------------------------------------------------
def _tuples(rng, dims, lead, distinct=True) -> np.ndarray:
    """Index tuples into `dims`, shaped lead + [len(dims)], with negative indices mixed in; distinct
    tuples unless not `distinct` (then tuple 0 is repeated at the end, so some position is hit twice)."""
    n = int(np.prod(lead))
    flat = rng.choice(int(np.prod(dims)), size=n, replace=not distinct)
    if not distinct:
        flat[-1] = flat[0]
    cols = np.stack(np.unravel_index(flat, dims), axis=-1)
    cols = np.where(rng.random(cols.shape) < 0.5, cols - np.array(dims), cols)  # same position, counted from the end
    return cols.reshape(*lead, len(dims)).astype(I64)


SCATTER_ND_CASES = [  # data shape, leading index shape, k
    ((4, 5, 3), (7,), 3),  # single elements
    ((4, 5, 3), (2, 3), 3),  # a batch of tuples
    ((4, 5, 3), (3,), 2),  # vectors of 3
    ((6, 5, 3), (2, 2), 1),  # rows
    ((9,), (4,), 1),
]
# reductions and the opsets that have them; the reductions take duplicate tuples (they accumulate)
SCATTER_REDUCTIONS = [("none", 11), ("none", 13), ("none", 18), ("add", 16), ("mul", 16), ("max", 18), ("min", 18)]


@pytest.mark.parametrize("reduction,opset", SCATTER_REDUCTIONS)
@pytest.mark.parametrize("dshape,lead,k", SCATTER_ND_CASES)
def test_scatter_nd(dshape, lead, k, reduction, opset):
    rng = np.random.default_rng(40)
    i = _tuples(rng, dshape[:k], lead, distinct=reduction == "none")
    u = rand(*lead, *dshape[k:], seed=41)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    pg = check_op("ScatterND", {"x": rand(*dshape, seed=42), "i": Const(i), "u": u}, attrs, opset=opset)
    assert "opaque" not in _ops(pg)


# axis, indices shape; more indices along the axis than the data has (7 > 5) only with a reduction
SCATTER_ELEMENTS_CASES = [
    pytest.param(axis, ishape, reduction, opset, id=f"{axis}-{'x'.join(map(str, ishape))}-{reduction}-{opset}")
    for (axis, ishape), (reduction, opset) in itertools.product(
        [(0, (2, 5, 3)), (1, (3, 4, 2)), (-1, (4, 5, 3)), (2, (1, 2, 3)), (1, (2, 7, 3))], SCATTER_REDUCTIONS)
    if not (reduction == "none" and ishape[1] == 7)
]


@pytest.mark.parametrize("axis,ishape,reduction,opset", SCATTER_ELEMENTS_CASES)
def test_scatter_elements(axis, ishape, reduction, opset):
    x = rand(4, 5, 3, seed=43)
    a = axis % 3
    d = x.shape[a]
    rng = np.random.default_rng(44)
    if reduction == "none":  # distinct positions along the axis on each line through it
        lines = rng.random((*ishape[:a], d, *ishape[a + 1:]))
        i = np.argsort(lines, axis=a).take(range(ishape[a]), axis=a)
    else:
        i = rng.integers(0, d, size=ishape)
    i = np.where(rng.random(ishape) < 0.5, i - d, i).astype(I64)  # negative indices count from the end
    attrs = {"axis": axis} | ({} if reduction == "none" else {"reduction": reduction})
    check_op("ScatterElements", {"x": x, "i": Const(i), "u": rand(*ishape, seed=45)}, attrs, opset=opset)


def test_scatter_slice_assignment_is_a_concat():
    """x[:, 1] = y and x[1:3, 2:4] *= y, as exporters write them: the written box becomes the updates
    CONCATenated with the data around it, without a position table."""
    x = rand(4, 5, 3, seed=46)
    i = np.array([[[r, 1]] for r in range(4)], I64)
    pg = check_op("ScatterND", {"x": x, "i": Const(i), "u": rand(4, 1, 3, seed=47)}, opset=13)
    assert set(_ops(pg)) <= {"slice", "concat", "reshape"} and "concat" in _ops(pg), _ops(pg)
    i = np.array([[[r, c] for c in (2, 3)] for r in (1, 2)], I64)
    pg = check_op("ScatterND", {"x": x, "i": Const(i), "u": rand(2, 2, 3, seed=48)}, {"reduction": "mul"}, opset=16)
    assert set(_ops(pg)) <= {"slice", "concat", "reshape", "mul"} and "concat" in _ops(pg), _ops(pg)
    # ScatterElements writing a permuted box (columns 1..3 of every row): the updates reordered, no mask
    i = np.array([[[3], [1], [2]]] * 4, I64).repeat(3, axis=2)
    pg = check_op("ScatterElements", {"x": x, "i": Const(i), "u": rand(4, 3, 3, seed=49)}, {"axis": 1}, opset=13)
    assert "where" not in _ops(pg) and "concat" in _ops(pg), _ops(pg)


def test_scatter_overwriting_everything_is_the_updates():
    pg = check_op("ScatterND", {"x": rand(4, 3, seed=50), "i": Const(np.array([[0], [1], [2], [3]], I64)),
                                "u": rand(4, 3, seed=51)}, opset=13)
    assert set(_ops(pg)) <= {"reshape"}, _ops(pg)  # the output's own name for the updates


def test_scatter_int_bool_and_half_data():
    rng = np.random.default_rng(52)
    xi = rng.integers(-9, 9, size=(5, 4)).astype(I64)
    i = Const(np.array([[1, 2], [-1, 0], [1, 2]], I64))
    check_op("ScatterND", {"x": xi, "i": i, "u": rng.integers(-9, 9, size=3).astype(I64)}, {"reduction": "add"}, opset=16)
    x32 = xi.astype(np.int32)
    i32 = Const(np.array([[0, 3, 1, 2], [-1, 0, 4, 3]], np.int32))  # int32 indices
    check_op("ScatterElements", {"x": x32, "i": i32, "u": x32[:2] * 3}, {"axis": 0, "reduction": "max"}, opset=18)
    xb = rng.random((5, 4)) < 0.5
    check_op("ScatterElements", {"x": xb, "i": Const(np.array([[2, 0, -1]], I64)), "u": ~xb[:1, :3]}, {"axis": 1},
             opset=13)
    check_op("ScatterND", {"x": xb, "i": Const(np.array([[3], [0]], I64)), "u": ~xb[:2]}, opset=13)
    check_op("ScatterND", {"x": rand(5, 4, seed=53).astype(np.float16), "i": Const(np.array([[4, 1], [0, 3]], I64)),
                           "u": rand(2, seed=54).astype(np.float16)}, opset=13)


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_scatter_max_and_min_treat_nan_as_onnxruntime_does(reduction):
    """onnxruntime combines as std::max(update, data): NaN data takes the update, a NaN update stays NaN
    (MAX and MIN would give NaN for both)."""
    nan = np.nan
    x = np.array([[nan, 1.0, 2.0, 3.0, nan, 0.5]], np.float32)
    u = np.array([[5.0, nan, nan, -1.0, nan, 4.0]], np.float32)
    i = Const(np.arange(6, dtype=I64).reshape(1, 6)[:, ::-1].copy() - 6)  # a reordered box, negative indices
    check_op("ScatterElements", {"x": x, "i": i, "u": u[:, ::-1].copy()}, {"axis": 1, "reduction": reduction}, opset=18)
    check_op("ScatterND", {"x": x.reshape(6, 1), "i": Const(np.array([[5], [0], [2], [3], [1], [4]], I64)),
                           "u": u.reshape(6, 1)[[5, 0, 2, 3, 1, 4]]}, {"reduction": reduction}, opset=18)
    check_op("ScatterND", {"x": x.reshape(6, 1), "i": Const(np.array([[5], [0], [5], [0]], I64)),  # duplicates
                           "u": np.array([[nan], [2.0], [7.0], [nan]], np.float32)}, {"reduction": reduction}, opset=18)


def test_scatter_bfloat16():
    """onnxruntime takes no bfloat16 feeds: the data and updates are cast to it in the model."""
    from onnx import TensorProto, helper
    from opcheck import graph_model, run_ort

    from tessera.ir import interp
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=TensorProto.BFLOAT16),
             helper.make_node("Cast", ["u"], ["ub"], to=TensorProto.BFLOAT16),
             helper.make_node("ScatterElements", ["xb", "i", "ub"], ["yb"], axis=1),
             helper.make_node("Cast", ["yb"], ["y"], to=TensorProto.FLOAT)]
    x, u = rand(3, 6, seed=55), rand(3, 2, seed=56)
    model = graph_model(nodes, {"x": x, "u": u, "i": Const(np.array([[5, 0], [1, -1], [2, 3]], I64))}, ["y"], opset=13)
    pg = fission(load(model).graph).graph
    assert "opaque" not in _ops(pg)
    got = interp.run(pg, {"x": x, "u": u})[pg.outputs[0]]
    np.testing.assert_array_equal(got, run_ort(model, {"x": x, "u": u})[0])


def test_scatter_without_updates_is_the_data():
    x = rand(4, 3, seed=57)
    pg = check_op("ScatterND", {"x": x, "i": Const(np.zeros((0, 1), I64)), "u": Const(np.zeros((0, 3), np.float32))},
                  opset=13)
    assert set(_ops(pg)) <= {"reshape"}, _ops(pg)
    check_op("ScatterElements", {"x": x, "i": Const(np.zeros((4, 0), I64)), "u": Const(np.zeros((4, 0), np.float32))},
             {"axis": 1}, opset=13)


def test_scatter_computed_indices_stay_opaque():
    x, u = rand(4, 3, seed=58), rand(2, 3, seed=59)
    reasons = _opaque_reasons("ScatterND", {"x": x, "i": np.array([[1], [3]], I64), "u": u}, opset=13)
    assert len(reasons) == 1 and "not a constant" in reasons[0], reasons
    reasons = _opaque_reasons("ScatterElements", {"x": x, "i": np.array([[1, 0, 2], [3, 1, 0]], I64), "u": u},
                              {"axis": 0}, opset=13)
    assert len(reasons) == 1 and "not a constant" in reasons[0], reasons
    # ...and the opaque node still computes the scatter
    check_op("ScatterND", {"x": x, "i": np.array([[1], [3]], I64), "u": u}, opset=13, allow_opaque=True)


def test_scatter_duplicates_without_reduction_stay_opaque():
    x = rand(4, 3, seed=60)
    reasons = _opaque_reasons("ScatterND", {"x": x, "i": Const(np.array([[1], [-3]], I64)), "u": rand(2, 3, seed=61)},
                              opset=13)
    assert len(reasons) == 1 and "duplicate" in reasons[0], reasons
    reasons = _opaque_reasons("ScatterElements", {"x": x, "i": Const(np.array([[2, 0, 1], [2, 1, 1]], I64)),
                                                  "u": rand(2, 3, seed=62)}, {"axis": 0}, opset=13)
    assert len(reasons) == 1 and "duplicate" in reasons[0], reasons


def test_scatter_unsupported_cases_say_why(monkeypatch):
    xb = np.ones((4, 3), bool)
    reasons = _opaque_reasons("ScatterND", {"x": xb, "i": Const(np.array([[1]], I64)), "u": xb[:1]},
                              {"reduction": "add"}, opset=16)
    assert len(reasons) == 1 and "on bool" in reasons[0], reasons
    import tessera.ops.placement as placement
    monkeypatch.setattr(placement, "SCATTER_TABLE_LIMIT", 8)  # 12 elements need a table; a box would not
    inputs = {"x": rand(4, 3, seed=63), "i": Const(np.array([[0, 0], [2, 1]], I64)), "u": rand(2, seed=64)}
    reasons = _opaque_reasons("ScatterND", inputs, opset=13)
    assert len(reasons) == 1 and "limit 8" in reasons[0], reasons
    inputs["i"] = Const(np.array([[2, 0], [2, 1]], I64))
    assert _opaque_reasons("ScatterND", inputs, opset=13) == []


def test_scatter_out_of_range_constant_is_an_error():
    model = build_model("ScatterND", {"x": rand(5, 4, seed=65), "i": Const(np.array([[1], [-6]], I64)),
                                      "u": rand(2, 4, seed=66)}, opset=13)
    with pytest.raises(TesseraError, match="indices out of range for extent 5"):
        fission(load(model).graph)
    model = build_model("ScatterElements", {"x": rand(5, 4, seed=65), "i": Const(np.array([[4]], I64)),
                                            "u": rand(1, 1, seed=66)}, {"axis": 1}, opset=13)
    with pytest.raises(TesseraError, match="indices out of range for extent 4"):
        fission(load(model).graph)


# ---- Col2Im (session 51) -------------------------------------------------------------------------------
COL2IM_CASES = [  # channels, image, block, strides, pads, dilations
    (3, [6, 8], [2, 2], [2, 2], None, None),  # patches that tile the image (MobileViTv2): a transpose
    (2, [5, 5], [3, 3], None, None, None),  # overlapping blocks, summed
    (2, [7, 6], [3, 2], [2, 1], [1, 0, 1, 1], None),
    (1, [9, 9], [2, 3], [2, 2], None, [2, 1]),
    (2, [8], [3], [2], [1, 1], None),  # one spatial axis
    (2, [4, 4, 4], [2, 2, 2], [2, 2, 2], None, None),  # three
]


@pytest.mark.parametrize("c,image,block,strides,pads,dil", COL2IM_CASES)
def test_col2im(c, image, block, strides, pads, dil):
    r = len(image)
    strides, pads, dil = strides or [1] * r, pads or [0] * 2 * r, dil or [1] * r
    blocks = [(image[i] + pads[i] + pads[r + i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
    x = rand(2, c * int(np.prod(block)), int(np.prod(blocks)), seed=100)
    pg = check_op("Col2Im", {"x": x, "img": Const(np.array(image, I64)), "blk": Const(np.array(block, I64))},
                  {"strides": strides, "pads": pads, "dilations": dil}, opset=18)
    if strides == block and not any(pads):
        assert set(_ops(pg)) <= {"reshape", "transpose"}, _ops(pg)


# ---- Trilu, OneHot (session 51) ------------------------------------------------------------------------
@pytest.mark.parametrize("upper,k,shape", [(1, None, (4, 5)), (0, 1, (2, 4, 5)), (1, -2, (2, 5, 4)), (0, 9, (3, 4)),
                                           (1, 7, (3, 4))])
def test_trilu(upper, k, shape):
    """A constant triangle over the last two axes, any diagonal (k past the matrix: all or nothing)."""
    inputs = {"x": rand(*shape, seed=120)} | ({} if k is None else {"k": Const(np.array(k, I64))})
    pg = check_op("Trilu", inputs, {"upper": upper}, opset=14)
    assert "matmul" not in _ops(pg)
    check_op("Trilu", {"x": np.arange(12, dtype=I64).reshape(3, 4)}, {"upper": upper}, opset=14)
    check_op("Trilu", {"x": np.random.default_rng(121).random((3, 4)) > 0.3}, {"upper": upper}, opset=14)  # an AND


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    """Negative indices count from the end; out of range (5, -5 of depth 4) gives a row of the off value;
    the values may be computed."""
    idx = np.array([[1, 3, -1], [0, 5, -5]], I64)
    check_op("OneHot", {"i": idx, "d": Const(np.array(4, I64)), "v": Const(np.array([0.0, 1.0], np.float32))},
             {"axis": axis}, opset=11)
    check_op("OneHot", {"i": idx, "d": Const(np.array([4], I64)), "v": np.array([-2.0, 3.0], np.float32)},
             {"axis": axis}, opset=11)


def test_one_hot_of_float_and_int32_indices():
    """Float indices truncate (1.7 -> 1, -1.2 -> -1 -> the last); int32 indices; int64 values (the type
    combinations onnxruntime implements)."""
    check_op("OneHot", {"i": np.array([1.7, -1.2, 2.0], np.float32), "d": Const(np.array(3.0, np.float32)),
                        "v": Const(np.array([0, 7], np.float32))}, opset=11)
    check_op("OneHot", {"i": np.array([1, -1, 2], np.int32), "d": Const(np.array(3, np.int32)),
                        "v": Const(np.array([0, 7], np.float32))}, opset=11)
    check_op("OneHot", {"i": np.array([1, -1, 2], I64), "d": Const(np.array(3, I64)),
                        "v": Const(np.array([0, 7], I64))}, opset=11)
