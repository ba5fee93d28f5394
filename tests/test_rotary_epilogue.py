"""Rotary positions in a GEMM template's epilogue (`codegen/rotary.py`, `orchestrate/rotary.py`): Llama's
`q * cos + rotate_half(q) * sin` after q's projection, with rotate_half read as a swap of the accumulator's
halves in registers. In Triton's interpreter on the CPU, against float64 and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from opcheck import Const, graph_model, rand
from kernelcheck import DEVICE
from test_gemm_template import check_template, run_exe
from test_norm_prologue import _measured

import tessera
from tessera import compiler
from tessera.codegen.select import implement
from tessera.codegen.kernels import GemmSchedule
from tessera.codegen.rotary import halves_swap, pairs_swap, partner_columns
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.cost.measured import Record
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.orchestrate.candidates import StructuralLegality
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import run_onnxruntime


def _i64(*v: int) -> Const:
    return Const(np.array(v, np.int64))


def rotary_model(s: int = 13, k: int = 24, heads: int = 2, d: int = 16, seed: int = 0, rows_last: bool = False,
                 neg_second: bool = False, bias: bool = False, with_v: bool = False, partial: int = 0,
                 pairs: bool = False):
    """x @ w cut into heads and transposed to [1, heads, s, d], then q * cos + rotate_half(q) * sin over the
    last axis (rotate_half = concat(-q[..., d/2:], q[..., :d/2]); with `neg_second` the other sign). With
    `rows_last`, q is the product transposed to [1, heads * d, s] instead: its last axis is the product's
    rows, which no tile holds whole, so no template can swap it (s must then be even). With `bias`, q's
    projection adds a bias first (Qwen2's). With `with_v`, the product is twice as wide and its second half,
    v, is only split into heads and transposed: a second output, "vt". With `partial` r, only each head's first
    r values rotate and the rest are put back beside them, cat(rotated(q[..., :r]), q[..., r:]) (GPT-NeoX's
    and Phi's partial rotary). With `pairs`, the rotation is GPT-J's rotate_every_two instead:
    stack(-q[..., 1::2], q[..., ::2]) flattened (with `neg_second`, stack(q[..., 1::2], -q[..., ::2]))."""
    if rows_last:
        layout = [helper.make_node("Transpose", ["y"], ["q"], perm=[0, 2, 1])]
        q_shape = (heads * d, s)
    else:
        layout = [helper.make_node("Reshape", ["y", "shape"], ["yh"]),
                  helper.make_node("Transpose", ["yh"], ["q"], perm=[0, 2, 1, 3])]
        q_shape = (s, partial or d)
    h = q_shape[-1] // 2
    neg = helper.make_node("Neg", ["x1" if neg_second else "x2"], ["nx"])
    project = [helper.make_node("MatMul", ["x", "w"], ["y0" if bias else "yq"])]
    if bias:
        project.append(helper.make_node("Add", ["y0", "bias"], ["yq"]))
    hd, outputs = heads * d, ["out"]
    if with_v:  # q = yq[..., :hd], v = yq[..., hd:] split into heads and transposed
        project += [helper.make_node("Slice", ["yq", "z", "hd", "ax"], ["y"]),
                    helper.make_node("Slice", ["yq", "hd", "hd2", "ax"], ["yv"]),
                    helper.make_node("Reshape", ["yv", "shape"], ["yvh"]),
                    helper.make_node("Transpose", ["yvh"], ["vt"], perm=[0, 2, 1, 3])]
        outputs.append("vt")
    else:
        project.append(helper.make_node("Identity", ["yq"], ["y"]))
    if partial:  # q's rotated part and the rest
        layout += [helper.make_node("Slice", ["q", "z", "big", "ax"], ["qr"]),
                   helper.make_node("Slice", ["q", "big", "dd", "ax"], ["qp"])]
    qr = "qr" if partial else "q"
    if pairs:  # x1 the even elements, x2 the odd ones; each element reads its neighbour
        rotate = [helper.make_node("Slice", [qr, "z", "big", "ax", "two"], ["x1"]),
                  helper.make_node("Slice", [qr, "one", "big", "ax", "two"], ["x2"]), neg,
                  helper.make_node("Unsqueeze", ["x2" if neg_second else "nx", "ax"], ["u_odd"]),
                  helper.make_node("Unsqueeze", ["nx" if neg_second else "x1", "ax"], ["u_even"]),
                  helper.make_node("Concat", ["u_odd", "u_even"], ["stacked"], axis=-1),
                  helper.make_node("Reshape", ["stacked", "qshape"], ["rot"])]
    else:
        rotate = [helper.make_node("Slice", [qr, "z", "half", "ax"], ["x1"]),
                  helper.make_node("Slice", [qr, "half", "big", "ax"], ["x2"]),
                  neg, helper.make_node("Concat", ["x2", "nx"] if neg_second else ["nx", "x1"], ["rot"], axis=-1)]
    nodes = [*project, *layout, *rotate,
             helper.make_node("Mul", [qr, "cos"], ["qc"]),
             helper.make_node("Mul", ["rot", "sin"], ["rs"]),
             helper.make_node("Add", ["qc", "rs"], ["rotated" if partial else "out"])]
    if partial:
        nodes.append(helper.make_node("Concat", ["rotated", "qp"], ["out"], axis=-1))
    feeds = {"x": rand(1, s, k, seed=seed)}
    width = 2 * hd if with_v else hd
    return graph_model(nodes, {**feeds, "w": Const(rand(k, width, seed=seed + 1, lo=-0.5, hi=0.5)),
                               "hd": _i64(hd), "hd2": _i64(2 * hd), "dd": _i64(d),
                               "shape": _i64(1, s, heads, d), "z": _i64(0), "half": _i64(h), "one": _i64(1),
                               "two": _i64(2), "qshape": _i64(1, *(q_shape if rows_last else (heads, *q_shape))),
                               "big": _i64(2 * h), "ax": _i64(-1), "cos": Const(rand(*q_shape, seed=seed + 2)),
                               "sin": Const(rand(*q_shape, seed=seed + 3)), "bias": Const(rand(width, seed=seed + 4))},
                       outputs, opset=18), feeds


def _concat_and_graph(model):
    g = fission(load(model).graph).graph
    producer = {o: n for n in g.nodes for o in n.outputs}
    (cat,) = [n for n in g.nodes if n.op == "concat"]
    (mm,) = [n for n in g.nodes if n.op == "matmul"]
    return g, producer, cat, mm


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("d,block_n", [(16, 16), (16, 64), (64, 64), (8, 32)])
def test_rotate_half_is_a_swap_of_the_accumulator_halves(precision, d, block_n):
    # 13 rows (ragged M), heads of d columns: the template computes q * cos + rotate_half(q) * sin itself
    model, feeds = rotary_model(s=13, k=24, heads=3, d=d, seed=d)
    ks, err = check_template(model, feeds, GemmSchedule(16, block_n, 16, 2, 2, 1, 1), precision)
    assert "tl.join(" in ks.source and "tl.split(" in ks.source
    assert err < TOLERANCE[precision]


def test_a_bias_before_the_rotation_is_swapped_with_the_accumulator():
    # q = x @ w + b (Qwen2's projection): the swapped tensor is the accumulator plus the bias, lane by lane
    model, feeds = rotary_model(s=13, k=24, heads=3, d=16, seed=11, bias=True)
    g, producer, cat, mm = _concat_and_graph(model)
    assert partner_columns(g, producer, mm.outputs[0], halves_swap(g, producer, cat))
    ks, _ = check_template(model, feeds, GemmSchedule(16, 32, 16, 2, 2, 1, 1), "fp16")
    assert "tl.join(" in ks.source


@pytest.mark.parametrize("neg_second", [False, True])
def test_both_signs_of_the_swap_are_recognised(neg_second):
    model, feeds = rotary_model(neg_second=neg_second)
    g, producer, cat, mm = _concat_and_graph(model)
    sw = halves_swap(g, producer, cat)
    assert sw is not None and sw.half == 8 and sw.axis == 3
    assert sw.signs == ((1, -1) if neg_second else (-1, 1))
    assert partner_columns(g, producer, mm.outputs[0], sw)
    check_template(model, feeds, GemmSchedule(16, 32, 16, 2, 2, 1, 1), "fp32")


def test_a_split_k_template_swaps_the_summed_tile():
    # the tile's last program sums the K slices, then rotates the sum (`tot`) the same way
    model, feeds = rotary_model(s=13, k=64, heads=2, d=16, seed=3)
    ks, _ = check_template(model, feeds, GemmSchedule(16, 32, 16, 2, 2, 1, 2), "fp16")
    assert "tl.join(" in ks.source and "tot" in ks.source


def test_a_tile_narrower_than_a_head_is_refused_by_name():
    model, feeds = rotary_model(d=32)
    with pytest.raises(Unsupported, match="BLOCK_N a multiple"):
        check_template(model, feeds, GemmSchedule(16, 16, 16, 2, 2, 1, 1), "fp32")


def test_a_swap_over_the_products_rows_stays_out_of_the_template():
    # q's last axis is the product's rows: a partner is another tile's, so no epilogue may hold the concat
    model, _ = rotary_model(s=12, rows_last=True)
    g, producer, cat, mm = _concat_and_graph(model)
    sw = halves_swap(g, producer, cat)
    assert sw is not None and not partner_columns(g, producer, mm.outputs[0], sw)
    og = build_ograph(g)
    everything = sum(1 << i for i in range(og.n))
    assert "cannot join" in StructuralLegality(prologues=True).check(og, everything)
    good, _ = rotary_model(s=12)
    og = build_ograph(fission(load(good).graph).graph)
    assert StructuralLegality(prologues=True).check(og, sum(1 << i for i in range(og.n))) is None


@pytest.mark.parametrize("cost,rows_last,bias", [("analytical", False, False), ("analytical", True, False),
                                                 ("measured", False, False), ("analytical", False, True)])
def test_compiled_plans_hold_the_rotation_where_they_can_and_pass(tmp_path, monkeypatch, cost, rows_last, bias):
    # Analytical, and measured with a profiler that prices templates low (`_measured`; on the GPU with
    # TESSERA_TEST_DEVICE=cuda the plan then runs there): one template computes the projection and the
    # rotation; with the swap over the product's rows the concat stays in a kernel of its own.
    model, _ = rotary_model(s=18, k=40, heads=4, d=16, seed=7, rows_last=rows_last, bias=bias)
    if cost == "measured":
        result = _measured(model, tmp_path, monkeypatch, "fp16")
    else:
        result = compile_model(model, CompileOptions(precision="fp16", cost="analytical", templates="force"))
    fused = [k for k in result.kernels if k.backend == "template" and any(n.op == "concat" for n in k.prims)]
    assert len(fused) == (0 if rows_last else 1), [k.name for k in result.kernels]
    if fused:
        assert "tl.join(" in fused[0].triton.source and len(result.kernels) <= 2  # the input cast, the template
    write_artifacts(result, tmp_path / "art")
    x = rand(1, 18, 40, seed=99)  # fresh inputs, not the export's
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})[0]
    assert rel_l2(got, run_onnxruntime(model, {"x": x})["out"]) < TOLERANCE["fp16"]


@pytest.mark.parametrize("cost", ["analytical", "measured"])
def test_v_split_into_heads_is_stored_transposed_beside_the_rotation(tmp_path, monkeypatch, cost):
    # Llama's merged QKV product: q is rotated, v only split into heads and transposed. One template
    # computes both and stores v at the transposed indices; no kernel of its own copies v (on the H100,
    # session 59, v's transpose kept a kernel that also rotated q, and the template held k's rotation alone).
    model, _ = rotary_model(s=18, k=40, heads=4, d=16, seed=8, with_v=True)
    if cost == "measured":
        result = _measured(model, tmp_path, monkeypatch, "fp16")
    else:
        result = compile_model(model, CompileOptions(precision="fp16", cost="analytical", templates="force"))
    (fused,) = [k for k in result.kernels if k.backend == "template"]
    assert any(n.op == "concat" for n in fused.prims) and any(n.op == "transpose" for n in fused.prims)
    assert set(fused.outputs) >= {"out", "vt"} and len(result.kernels) <= 2, [k.name for k in result.kernels]
    write_artifacts(result, tmp_path / "art")
    x = rand(1, 18, 40, seed=98)
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})
    want = run_onnxruntime(model, {"x": x})
    assert rel_l2(got[0], want["out"]) < TOLERANCE["fp16"] and rel_l2(got[1], want["vt"]) < TOLERANCE["fp16"]


class _NarrowTileProfiler:
    """Templates cost less the narrower their tile (so a bare product's fastest is narrower than a head)
    and fail where their source cannot be generated, as the GPU profiler's build does; `refused` keeps
    each failed template's reason."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def measure(self, jobs, record: Record) -> None:
        for i, j in enumerate(jobs):
            if not isinstance(j.schedule, GemmSchedule):
                record(i, 2e-6 * len(j.prims), "")
                continue
            try:
                implement(j.graph, j.prims, j.prologue, j.outputs, "k", (), j.schedule, j.precision)
            except Unsupported as e:
                self.refused.append(str(e))
                record(i, float("inf"), str(e))
                continue
            record(i, 1e-6 + j.schedule.block_n * 1e-9, "")


def test_rotary_candidates_take_tiles_of_whole_heads_not_the_products_fastest(tmp_path, monkeypatch):
    # On the H100 (session 59) the bare QKV product's fastest tile was 32 columns wide, and every candidate
    # with the rotation inherited it: rotate_half over a 64-wide head cannot be built in it, so all failed
    # and llama kept its rotary kernels. A candidate's schedules must come from its own space.
    model, _ = rotary_model(s=18, k=40, heads=2, d=64, seed=7)
    prof = _NarrowTileProfiler()
    monkeypatch.setattr(compiler.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(compiler.torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db"), precision="fp16"))
    monkeypatch.undo()
    assert not [r for r in prof.refused if "rotate_half" in r], prof.refused[:3]
    fused = [k for k in result.kernels if k.backend == "template" and any(n.op == "concat" for n in k.prims)]
    assert len(fused) == 1 and fused[0].triton.schedule.block_n % 64 == 0, \
        [(k.name, k.triton and k.triton.schedule) for k in result.kernels]


@pytest.mark.parametrize("partial,d", [(8, 16), (16, 64), (32, 64)])
def test_partial_rotary_is_selected_back_beside_the_rest_of_the_head(tmp_path, partial, d):
    # GPT-NeoX and Phi rotate each head's first r values and concatenate the rest back: the template swaps
    # runs of r columns and selects, per column, the rotation or its own accumulator (the second part's
    # index, shifted back by the slice, is the tile's own: `index.add_const`).
    model, _ = rotary_model(s=18, k=40, heads=2, d=d, seed=9, partial=partial)
    result = compile_model(model, CompileOptions(precision="fp16", cost="analytical", templates="force"))
    fused = [k for k in result.kernels if k.backend == "template"]
    assert len(fused) == 1 and sum(n.op == "concat" for n in fused[0].prims) == 2, \
        [(k.name, k.backend) for k in result.kernels]
    write_artifacts(result, tmp_path / "art")
    x = rand(1, 18, 40, seed=97)
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})[0]
    assert rel_l2(got, run_onnxruntime(model, {"x": x})["out"]) < TOLERANCE["fp16"]


def _stack_reshape_and_graph(model):
    g = fission(load(model).graph).graph
    producer = {o: n for n in g.nodes for o in n.outputs}
    swaps = [n for n in g.nodes if pairs_swap(g, producer, n) is not None]
    (mm,) = [n for n in g.nodes if n.op == "matmul"]
    return g, producer, swaps, mm


@pytest.mark.parametrize("neg_second", [False, True])
def test_rotate_every_two_is_a_swap_of_neighbouring_columns(neg_second):
    # GPT-J's interleaved form: element d reads d + 1 (even d) or d - 1 (odd d), with the sign of its parity
    model, feeds = rotary_model(s=13, k=24, heads=3, d=16, seed=5, pairs=True, neg_second=neg_second)
    g, producer, swaps, mm = _stack_reshape_and_graph(model)
    assert len(swaps) == 1
    sw = pairs_swap(g, producer, swaps[0])
    assert sw.pairs and sw.half == 1 and sw.axis == 3 and sw.signs == ((1, -1) if neg_second else (-1, 1))
    assert partner_columns(g, producer, mm.outputs[0], sw)
    assert halves_swap(g, producer, [n for n in g.nodes if n.op == "concat"][0]) is None
    ks, err = check_template(model, feeds, GemmSchedule(16, 32, 16, 2, 2, 1, 1), "fp32")
    assert "tl.join(" in ks.source and "% 2 == 0" in ks.source and err < TOLERANCE["fp32"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_rotate_every_two_in_narrow_tiles_and_a_split_k_sum(precision):
    # any even tile width holds whole pairs; a split-K template swaps its summed tile the same way
    model, feeds = rotary_model(s=13, k=64, heads=2, d=8, seed=6, pairs=True)
    for schedule in (GemmSchedule(16, 16, 16, 2, 2, 1, 1), GemmSchedule(16, 32, 16, 2, 2, 1, 2)):
        ks, err = check_template(model, feeds, schedule, precision)
        assert "tl.join(" in ks.source and err < TOLERANCE[precision]


def test_rotate_every_two_over_the_products_rows_is_no_swap():
    # q's last axis is the product's rows: a neighbour lies in another row of the tile, not another column
    model, _ = rotary_model(s=12, rows_last=True, pairs=True)
    g, producer, swaps, mm = _stack_reshape_and_graph(model)
    assert len(swaps) == 1 and not partner_columns(g, producer, mm.outputs[0], pairs_swap(g, producer, swaps[0]))


@pytest.mark.parametrize("cost,partial,d", [("analytical", 0, 16), ("analytical", 8, 16), ("measured", 8, 16),
                                            ("analytical", 32, 64)])
def test_compiled_plans_hold_gptj_rotations_in_the_projection(tmp_path, monkeypatch, cost, partial, d):
    # GPT-J and CodeGen: interleaved pairs over each head's first r values (partial), the rest put back.
    # One template computes the projection, the rotation and the select; its step-2 slices and stack are
    # read from the accumulator's registers, never computed.
    model, _ = rotary_model(s=18, k=40, heads=2, d=d, seed=12, partial=partial, pairs=True)
    if cost == "measured":
        result = _measured(model, tmp_path, monkeypatch, "fp16")
    else:
        result = compile_model(model, CompileOptions(precision="fp16", cost="analytical", templates="force"))
    fused = [k for k in result.kernels if k.backend == "template"]
    assert len(fused) == 1 and any(n.op == "concat" for n in fused[0].prims) and len(result.kernels) <= 2, \
        [(k.name, k.backend) for k in result.kernels]
    assert "tl.join(" in fused[0].triton.source
    write_artifacts(result, tmp_path / "art")
    x = rand(1, 18, 40, seed=96)
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})[0]
    assert rel_l2(got, run_onnxruntime(model, {"x": x})["out"]) < TOLERANCE["fp16"]


def test_a_pairs_swap_whose_slice_is_read_elsewhere_stays_out_of_the_template(tmp_path):
    # q's even elements (a step-2 slice) are also a graph output: a template reading the swap from its
    # registers never computes that slice, so it could not store it. No candidate holds the product with the
    # rotation (without the check, one that the template refused ran as a library call and an epilogue)
    model, _ = rotary_model(s=18, k=40, heads=2, d=16, seed=13, pairs=True)
    model.graph.output.append(helper.make_tensor_value_info("x1", 1, [1, 2, 18, 8]))
    result = compile_model(model, CompileOptions(precision="fp32", cost="analytical", templates="force"))
    ops = [{n.op for n in k.prims} for k in result.kernels]
    assert not [o for o in ops if {"matmul", "concat"} <= o], ops
    write_artifacts(result, tmp_path / "art")
    x = rand(1, 18, 40, seed=95)
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})
    want = run_onnxruntime(model, {"x": x})
    assert rel_l2(got[0], want["out"]) < TOLERANCE["fp32"] and rel_l2(got[1], want["x1"]) < TOLERANCE["fp32"]
