"""Constant tables with a closed form in their position (`ir/tables.py`), computed by generated kernels."""
from __future__ import annotations

import numpy as np
import pytest
from kernelcheck import check_kernel
from onnx import helper
from opcheck import Const, graph_model, rand

from tessera.codegen.kernels import Schedule
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.signature import kernel_signature
from tessera.ir.tables import PeriodicTable, periodic_table


def _bilinear_tables(n_in: int, n_out: int) -> tuple[np.ndarray, ...]:
    """A half-pixel linear Resize's tables, as onnxruntime's formula gives them."""
    x = np.clip((np.arange(n_out, dtype=np.float32) + 0.5) * np.float32(n_in / n_out) - 0.5, 0, n_in - 1)
    lo = np.minimum(x.astype(np.int64), n_in - 1)
    hi = np.minimum(lo + 1, n_in - 1)
    w_hi, w_lo = np.abs(x - lo), np.abs(x - hi)
    edge = lo == hi
    w_lo[edge], w_hi[edge] = 1, 0
    return lo, hi, w_lo.astype(np.float32), w_hi.astype(np.float32)


@pytest.mark.parametrize("n_in, scale", [(64, 2), (16, 4), (9, 2), (5, 4)])
def test_whole_number_upsampling_tables_have_a_closed_form(n_in, scale):
    for table in _bilinear_tables(n_in, n_in * scale):
        for t in (table, table.astype(np.float16) if table.dtype.kind == "f" else table.astype(np.int32)):
            form = periodic_table(t)
            assert form is not None and form.period <= scale and len(form.head) + len(form.tail) <= 4
            assert np.array_equal(form.values().astype(t.dtype), t)  # exactly, the floats included


def test_the_2x_lower_index_is_half_the_position_less_one_but_at_the_first():
    lo = _bilinear_tables(64, 128)[0]
    assert periodic_table(lo) == PeriodicTable(128, 2, (-1, 0), 1, (0,), ())
    assert periodic_table(np.arange(40) // 2) == PeriodicTable(40, 2, (0, 0), 1, (), ())  # nearest 2x


@pytest.mark.parametrize("table", [
    np.random.default_rng(3).integers(0, 9, 100),  # no pattern
    np.random.default_rng(4).random(64).astype(np.float32),  # a bias
    _bilinear_tables(30, 45)[2],  # 1.5x weights: every 3 positions, but rounded differently
    _bilinear_tables(8, 64)[3],  # 8x: a period of 8, more selects than the load is worth
    np.arange(5),  # too short to pay
    np.array([0.0, np.inf] * 8, np.float32),
])
def test_tables_without_a_closed_form_are_loaded(table):
    assert periodic_table(table) is None


def _resize_model(shape, scales, mode="linear", seed=61):
    x = rand(*shape, seed=seed)
    m = graph_model([helper.make_node("Resize", ["x", "", "sc"], ["out"], mode=mode,
                                      coordinate_transformation_mode="half_pixel" if mode == "linear" else "asymmetric")],
                    {"x": x, "sc": Const(np.array(scales, np.float32))}, ["out"])
    return m, {"x": x}


@pytest.mark.parametrize("shape, scales, mode", [
    ((1, 3, 5, 7), (1, 1, 2, 2), "linear"), ((2, 3, 9, 4), (1, 1, 4, 1), "linear"),
    ((1, 2, 4, 6), (1, 1, 2, 2), "nearest"), ((1, 3, 10, 12), (1, 1, 1.5, 1.5), "linear")])
@pytest.mark.parametrize("schedule", [None, Schedule(16, 1, 4)])
def test_a_resize_kernel_computes_its_tables(shape, scales, mode, schedule):
    # Against the float64 reference; whole-number scales load nothing but the data, 1.5x loads its tables.
    m, feeds = _resize_model(shape, scales, mode)
    ks = check_kernel(m, feeds, schedule)
    loads = [ln for ln in ks.source.splitlines() if "tl.load(" in ln]
    tables = [ln for ln in loads if "tl.load(in0 " not in ln]
    assert (tables == []) == all(float(s).is_integer() for s in scales), ks.source


def test_a_tables_form_is_part_of_the_kernel_signature():
    # Two kernels alike but for a table's values generate different code, so they are timed apart.
    def sig(table):
        m = graph_model([helper.make_node("Gather", ["x", "i"], ["out"], axis=1)],
                        {"x": rand(3, 20, seed=7), "i": Const(table)}, ["out"])
        g = fission(load(m).graph).graph
        return kernel_signature(g, g.nodes, [], list(g.outputs))

    halves, thirds = np.arange(40) // 2, np.arange(40) // 3
    assert sig(halves) != sig(thirds)
    assert sig(halves) == sig(halves.copy())
