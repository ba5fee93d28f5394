"""A product read only through column slices, one accumulator per slice (`gemm.column_slices`): a Llama
MLP's gate and up projections, merged over their weights into one matmul (`rewrite/merged.py`), with
silu(gate) * up computed in the template's epilogue, so neither half is stored. In Triton's interpreter
on the CPU, against float64 and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from opcheck import Const, graph_model, rand
from kernelcheck import DEVICE
from test_gemm_template import check_template, matmul_kernel, run_exe, run_template
from test_norm_prologue import _measured, _rmsnorm

import tessera
from tessera.codegen.gemm import column_slices, tile_problem
from tessera.codegen.kernels import GemmSchedule
from tessera.codegen.select import implement, prologue_of
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import write_artifacts
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.orchestrate import build_ograph
from tessera.rewrite.merged import merge_weight_matmuls
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import run_onnxruntime


def _swiglu(x: np.ndarray, k: int, width: int, seed: int, norm: bool = False) -> object:
    """silu(y @ wg) * (y @ wu), y = x or RMSNorm(x): the MLP's first half as transformers exports it."""
    pre, consts = _rmsnorm("x", "y", k, seed=seed + 5) if norm else ([], {})
    return graph_model([*pre, helper.make_node("MatMul", ["y" if norm else "x", "wg"], ["g"]),
                        helper.make_node("MatMul", ["y" if norm else "x", "wu"], ["u"]),
                        helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
                        helper.make_node("Mul", ["silu", "u"], ["out"])],
                       {"x": x, **consts, "wg": Const(rand(k, width, seed=seed)),
                        "wu": Const(rand(k, width, seed=seed + 1))}, ["out"], opset=18)


def _merged(model):
    g, steps = merge_weight_matmuls(fission(load(model).graph).graph)
    assert len(steps) == 1
    return g


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("width,block_n", [(40, 16), (32, 32)])  # ragged and whole column tiles
def test_gate_and_up_share_one_walk_and_the_product_is_never_stored(precision, width, block_n):
    x = rand(2, 13, 24, seed=120)
    g = _merged(_swiglu(x, 24, width, 121))
    prims, pro, outputs = matmul_kernel(g)
    (root,) = [n for n in prims if n.op == "matmul"]
    assert [sl.attrs["starts"][-1] for sl in column_slices(g, prims, outputs, root)] == [0, width]
    batch, m, n, k, accs = tile_problem(g, root, column_slices(g, prims, outputs, root))
    assert (batch * m, n, k, accs) == (26, width, 24, 2)
    ks, _ = check_template(None, {"x": x}, GemmSchedule(16, block_n, 16, 2, 2, 1, 1), precision, graph=g)
    src = ks.source
    assert src.count("tl.dot(") == 2 and "acc1 = tl.dot(" in src and f"+ {width}" in src
    assert len(ks.outputs) == 1 and len(ks.launches) == 1 and ks.launches[0].grid[0] == -(-m // 16) * -(-width // block_n)


def test_an_rmsnorm_in_the_prologue_scales_both_accumulators():
    # The norm's rstd is deferred onto each accumulator; its mean square accumulates once in the walk.
    x = rand(2, 13, 40, seed=122)
    g = _merged(_swiglu(x, 40, 24, 123, norm=True))
    og = build_ograph(g)
    prims = list(og.nodes)
    ks = implement(g, prims, prologue_of(og, prims), list(g.outputs), "k0_test", (),
                   GemmSchedule(16, 16, 16, 2, 2, 1, 1)).triton
    got = run_template(g, ks, {**g.constants, "x": x})
    assert rel_l2(got["out"], interp.run(g, {"x": x}, exact=True)["out"]) < TOLERANCE["fp32"]
    assert "acc0 = acc0 *" in ks.source and "acc1 = acc1 *" in ks.source and ks.source.count("for ") == 1


def test_no_split_k_and_no_slices_of_unequal_width():
    x = rand(1, 16, 256, seed=124)
    g = _merged(_swiglu(x, 256, 16, 125))
    prims, pro, outputs = matmul_kernel(g)
    with pytest.raises(Unsupported, match="split over K"):
        implement(g, prims, pro, outputs, "k", (), GemmSchedule(16, 16, 32, 2, 2, 1, 4))
    # gate 16 wide, up 8: no common tile; the slices are read as before (the product's outputs only)
    model = graph_model([helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
                         helper.make_node("ReduceSum", ["g", "ax"], ["gs"], keepdims=1),
                         helper.make_node("Mul", ["gs", "u"], ["out"])],
                        {"x": x, "wg": Const(rand(256, 16, seed=126)), "wu": Const(rand(256, 8, seed=127)),
                         "ax": Const(np.array([-1], np.int64))}, ["out"], opset=18)
    g = _merged(model)
    root = next(n for n in g.nodes if n.op == "matmul")
    assert column_slices(g, g.nodes, list(g.outputs), root) is None


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_measured_compile_runs_norm_gate_and_up_as_one_template(tmp_path, monkeypatch, precision):
    # RMSNorm -> merged gate/up -> silu * up: with templates priced below library calls, the whole is one
    # template kernel that stores neither half. (With the down projection after it, its operand
    # prologue could compute silu * up instead: as many kernels, which the fake profiler prices alike.)
    x = rand(2, 13, 48, seed=128)
    model = _swiglu(x, 48, 40, 130, norm=True)
    result = _measured(model, tmp_path, monkeypatch, precision)
    (gated,) = [k for k in result.kernels if sum(n.op == "slice" for n in k.prims) == 2]
    assert gated.backend == "template" and {"matmul", "sigmoid", "reduce_sum"} <= {n.op for n in gated.prims}
    assert "acc1" in gated.triton.source and result.tuning["failed"] == 0 and len(result.kernels) == 1
    write_artifacts(result, tmp_path / "art")
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), {"x": x})[0]
    assert rel_l2(got, run_onnxruntime(model, {"x": x})["out"]) < TOLERANCE[precision]


def test_the_ranked_schedules_fit_two_accumulators():
    # 128 rows x K 768 -> 2 x 2048 (the zoo llama's MLP) in fp16: no split K, the accumulators within
    # one 128 x 256 tile's registers, every stage's A tile and two B tiles within shared memory.
    from tessera.cost.devices import device
    from tessera.cost.schedule_model import rank_templates
    from tessera.rewrite.precision import convert_precision

    g = convert_precision(_merged(_swiglu(rand(1, 128, 768, seed=133), 768, 2048, 134)), "fp16")
    prims, pro, outputs = matmul_kernel(g)
    ranked = rank_templates(g, pro + prims, outputs, "fp16")
    assert ranked and all(s.split_k == 1 and s.block_m * s.block_n <= 128 * 128 for s in ranked)
    assert all(s.num_stages * (s.block_m + 2 * s.block_n) * s.block_k * 2 <= device("h100").smem_bytes for s in ranked)
    (root,) = [n for n in prims if n.op == "matmul"]
    alone = rank_templates(g, [*pro, root], [root.outputs[0]], "fp16")  # the product itself splits K here
    assert any(s.split_k > 1 for s in alone)


def test_the_compile_summary_counts_column_slice_templates(tmp_path, capsys):
    import onnx

    from tessera.cli.main import main

    onnx.save(_swiglu(rand(2, 13, 48, seed=142), 48, 40, 143), tmp_path / "mlp.onnx")
    assert main(["compile", str(tmp_path / "mlp.onnx"), "-o", str(tmp_path / "out"), "--templates", "force",
                 "--cost", "analytical", "--precision", "fp16"]) == 0
    assert "1 reading their product through column slices" in capsys.readouterr().out
