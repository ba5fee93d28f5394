"""GEMM templates (codegen/gemm.py): one generated kernel per matmul kernel, epilogue fused.

Each generator case takes a small model's matmul kernel (the matmul, every primitive computed from
its result, their free prologue) as a template under Triton's interpreter and compares what it
writes with the float64 reference on random inputs; the tensors the kernel reads come from the
reference interpreter. The wiring (plans, measured compiles that pick a template, artifacts, whole
models) is in test_gemm_template_wiring.py.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from kernelcheck import DEVICE
from onnx import helper
from fake_profiler import TemplatePrologueProfiler
from opcheck import Const, graph_model, rand

import tessera
from tessera import compiler
from tessera.codegen.gemm import template_schedules
from tessera.codegen.kernels import GemmSchedule, KernelSource, Schedule, schedule_from_json
from tessera.codegen.launch import TritonKernel, use_interpreter
from tessera.codegen.select import implement, prologue_of
from tessera.codegen.triton_ops import Unsupported
from tessera.compiler import CompileOptions, compile_model, write_artifacts
from tessera.cost.measured import _schedule_key
from tessera.cost.schedule_model import rank_templates
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType
from tessera.orchestrate import build_ograph
from tessera.orchestrate.graphview import bits
from tessera.rewrite import convert_precision
from tessera.runtime.buffers import inverse_perm, round_tf32
from tessera.runtime.torch_prims import TORCH_DTYPES
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.verify import run_onnxruntime

# ---- harness -----------------------------------------------------------------------------------
def matmul_kernel(g: Graph) -> tuple[list[Node], list[Node], list[str]]:
    """The plan-shaped kernel of g's matmul: the matmul and what is computed from it (not the
    casts to the declared output types), its free prologue, and the tensors it writes."""
    og = build_ograph(g)
    (root,) = [n for n in og.nodes if n.op == "matmul"]
    i = og.index[root.name]
    prims = [root] + [og.nodes[j] for j in bits(og.desc[i]) if not og.nodes[j].name.endswith("/cast_out")]
    names = {o for n in prims for o in n.outputs}
    outputs = []
    for o in g.outputs:
        producer = next(n for n in g.nodes if o in n.outputs)
        outputs.append(producer.inputs[0] if producer.name.endswith("/cast_out") else o)
    assert all(o in names for o in outputs)
    return prims, prologue_of(og, prims), outputs


def _memory(a: np.ndarray, t: TensorType) -> torch.Tensor:
    """Values in their storage order (what the kernel addresses), as the device tensor."""
    a = np.ascontiguousarray(a.transpose(t.layout) if t.layout else a)
    x = torch.from_numpy(a.astype(np.float32) if t.dtype is DType.BFLOAT16 else a.copy())
    return x.to(DEVICE, TORCH_DTYPES[t.dtype])


def template_launch(g: Graph, ks: KernelSource, env: dict[str, np.ndarray]
                    ) -> tuple[TritonKernel, list[torch.Tensor], list[torch.Tensor]]:
    """The kernel, its inputs as the runtime stores them (a constant it reads in another order or
    rounded to tf32: that copy) and its empty outputs, on DEVICE."""
    use_interpreter(torch.device(DEVICE))  # on the CPU, with the interpreter computing as the GPU does
    def stored(t: str) -> TensorType:  # a constant the kernel reads from a copy in another order
        ty = g.types[t]
        return TensorType(ty.shape, ty.dtype, ks.input_layouts[t]) if t in ks.input_layouts else ty

    args = [_memory(np.asarray(env[t]), stored(t)) for t in ks.inputs]
    args = [round_tf32(a) if t in ks.rounded_inputs else a for t, a in zip(ks.inputs, args)]  # as the runtime
    outs = [torch.empty(g.types[t].storage_shape, dtype=TORCH_DTYPES[g.types[t].dtype], device=DEVICE)
            for t in ks.outputs]
    return TritonKernel(ks), args, outs


def run_template(g: Graph, ks: KernelSource, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    kernel, args, outs = template_launch(g, ks, env)
    kernel(*args, *outs)
    got = {}
    for t, o in zip(ks.outputs, outs):
        a = o.float().cpu().numpy()
        lay = g.types[t].layout
        got[t] = a.transpose(inverse_perm(lay)) if lay else a
    return got


def run_exe(exe, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """An executable's outputs for `feeds` (its inputs by name), as NumPy arrays."""
    outs = exe(*[torch.from_numpy(feeds[n]).to(DEVICE) for n in exe.input_names])
    return [o.float().cpu().numpy() for o in outs]


def check_template(model: onnx.ModelProto, feeds: dict[str, np.ndarray], schedule: GemmSchedule | None = None,
                   precision: str = "fp32", layouts: dict[str, tuple[int, ...]] | None = None,
                   graph: Graph | None = None) -> tuple[KernelSource, float]:
    """The model's matmul kernel as a template (by default its best-ranked schedule) against float64:
    the kernel and its largest error."""
    g32 = graph if graph is not None else fission(load(model).graph).graph
    g = convert_precision(g32, precision)
    for t, lay in (layouts or {}).items():
        g.types[t] = TensorType(g.types[t].shape, g.types[t].dtype, lay)
    prims, pro, outputs = matmul_kernel(g)
    if schedule is None:
        schedule = rank_templates(g, pro + prims, outputs, precision)[0]
    ks = implement(g, prims, pro, outputs, "k0_test", ("MatMul_0",), schedule, precision).triton
    assert ks is not None
    env = {**g.constants, **interp.run(g, feeds, keep_all=True)}  # what earlier kernels would write
    got = run_template(g, ks, env)
    ref = interp.run(g32, feeds, exact=True)
    errs = [rel_l2(got[t], ref[o]) for o, t in zip(g32.outputs, outputs)]
    assert max(errs) < TOLERANCE[precision], f"rel L2 {errs} under {schedule}\n{ks.source}"
    return ks, max(errs)


def dense(m: int, n: int, k: int, epilogue: str = "relu", seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """x [m, k] @ w [k, n] + bias, then an activation (ONNX Gelu forms, Relu, or the GPT-2 tanh chain)."""
    x, w, b = rand(m, k, seed=seed), rand(k, n, seed=seed + 1, lo=-0.5, hi=0.5), rand(n, seed=seed + 2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])]
    inits: dict = {"x": x, "w": Const(w), "b": Const(b)}
    if epilogue == "relu":
        nodes.append(helper.make_node("Relu", ["z"], ["out"]))
    elif epilogue in ("gelu", "gelu_tanh"):
        nodes.append(helper.make_node("Gelu", ["z"], ["out"], **({"approximate": "tanh"} if epilogue == "gelu_tanh" else {})))
    elif epilogue == "gpt2":  # 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))), as GPT-2's exporter writes it
        for name, v in {"three": 3.0, "c": 0.044715, "s": float(np.sqrt(2 / np.pi)), "one": 1.0, "half": 0.5}.items():
            inits[name] = Const(np.array(v, np.float32))
        nodes += [helper.make_node("Pow", ["z", "three"], ["p"]), helper.make_node("Mul", ["p", "c"], ["pc"]),
                  helper.make_node("Add", ["z", "pc"], ["i"]), helper.make_node("Mul", ["i", "s"], ["is"]),
                  helper.make_node("Tanh", ["is"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
                  helper.make_node("Mul", ["z", "half"], ["zh"]), helper.make_node("Mul", ["zh", "t1"], ["out"])]
    return graph_model(nodes, inits, ["out"]), {"x": x}


# ---- the generator -----------------------------------------------------------------------------
SHAPES = [(1, 7, 13), (7, 13, 31), (13, 1, 67), (31, 67, 7), (64, 64, 64), (67, 31, 1), (13, 67, 64), (67, 64, 13)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_odd_and_prime_shapes_with_bias_and_relu(m, n, k):
    model, feeds = dense(m, n, k, seed=m + n + k)
    check_template(model, feeds)
    # Small blocks: many tiles, ragged edges on every side, swizzled in groups of two tile rows.
    check_template(model, feeds, GemmSchedule(16, 16, 16, 2, 2, 2, 1))


def test_a_one_element_product_stores_at_a_literal_offset():
    # [1] @ [1, 1]: M = N = K = 1, so the store's offset is the literal 0, which tl.broadcast_to
    # does not take (the fuzzer's first template plans, session 56).
    x = rand(1, seed=130)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["out"])], {"x": x, "w": Const(rand(1, 1, seed=131))},
                        ["out"])
    ks, _ = check_template(model, {"x": x})
    assert "tl.full([BLOCK_M, BLOCK_N], 0, tl.int32)" in ks.source


@pytest.mark.parametrize("epilogue", ["gelu", "gelu_tanh", "gpt2"])
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # Pow's log(|x|) on masked lanes
def test_gelu_forms(epilogue):
    ks, _ = check_template(*dense(31, 67, 64, epilogue, seed=3))
    assert ("tl.erf" in ks.source) == (epilogue == "gelu")
    assert "acc + " in ks.source  # the bias is added to the accumulator, in registers


def test_batched_with_residual_and_scale():
    a, b, r = rand(2, 3, 13, 31, seed=1), rand(2, 3, 31, 7, seed=2), rand(2, 3, 13, 7, seed=3)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["y"]), helper.make_node("Mul", ["y", "s"], ["ys"]),
                         helper.make_node("Add", ["ys", "r"], ["out"])],
                        {"a": a, "b": b, "r": r, "s": Const(np.array(0.125, np.float32))}, ["out"])
    ks, _ = check_template(model, {"a": a, "b": b, "r": r}, GemmSchedule(16, 16, 16, 2, 2, 1, 1))
    assert ks.launches[0].grid == (1, 6)  # one tile per batch entry


def test_batch_broadcast_weight_and_reshaped_product():
    # A constant weight shared by a batch is read through its broadcast (index 0), never copied;
    # [2, 13, K] @ [K, N] folds the batch into M and reshapes the product back.
    x = rand(2, 3, 5, 7, seed=4)
    check_template(graph_model([helper.make_node("MatMul", ["x", "w"], ["out"])],
                               {"x": x, "w": Const(rand(3, 7, 4, seed=5))}, ["out"]), {"x": x})
    x, r = rand(2, 13, 31, seed=6), rand(2, 13, 7, seed=7)
    check_template(graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "r"], ["out"])],
                               {"x": x, "r": r, "w": Const(rand(31, 7, seed=8))}, ["out"]), {"x": x, "r": r},
                   GemmSchedule(16, 16, 16, 2, 2, 1, 1))


def test_transposed_weight_is_read_in_place():
    # Gemm transB=1: the transpose of the constant weight is index arithmetic in the K loop.
    x = rand(13, 31, seed=9)
    model = graph_model([helper.make_node("Gemm", ["x", "w", "c"], ["out"], transB=1, alpha=0.5)],
                        {"x": x, "w": Const(rand(67, 31, seed=10)), "c": Const(rand(67, seed=11))}, ["out"])
    ks, _ = check_template(model, {"x": x}, GemmSchedule(16, 32, 16, 2, 2, 1, 1))
    assert "transpose" in ks.source  # named in the header as a prologue primitive


def test_sliced_constant_operand_is_read_in_place():
    # A slice of a constant (start 3, step 2 along N) feeds the matmul without a copy.
    x = rand(7, 13, seed=12)
    w = rand(13, 40, seed=13)
    types = {"x": TensorType((7, 13), DType.FLOAT32), "w": TensorType((13, 40), DType.FLOAT32),
             "ws": TensorType((13, 17), DType.FLOAT32), "out": TensorType((7, 17), DType.FLOAT32)}
    g = Graph(name="sliced", kind=GraphKind.PRIMITIVE, inputs=["x"], outputs=["out"], types=types,
              constants={"w": w}, nodes=[Node("slice", "slice", ("w",), ("ws",), {"starts": [0, 3], "steps": [1, 2], "shape": [13, 17]}),
                                         Node("mm", "matmul", ("x", "ws"), ("out",))])
    check_template(None, {"x": x}, GemmSchedule(16, 16, 16, 2, 2, 1, 1), graph=g)


def test_permuted_layouts_need_no_copy():
    # Operands and outputs stored in permuted orders: the strides are baked into the addresses.
    x = rand(13, 31, seed=14)
    model, _ = dense(13, 7, 31, seed=14)
    check_template(model, {"x": x}, GemmSchedule(16, 16, 16, 2, 2, 1, 1), layouts={"x": (1, 0), "out": (1, 0)})
    a, b = rand(2, 13, 31, seed=15), rand(2, 31, 7, seed=16)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["y"]), helper.make_node("Relu", ["y"], ["out"])],
                        {"a": a, "b": b}, ["out"])
    check_template(model, {"a": a, "b": b}, GemmSchedule(16, 16, 16, 2, 2, 1, 1),
                   layouts={"a": (2, 0, 1), "b": (0, 2, 1), "out": (1, 2, 0)})


@pytest.mark.parametrize("precision", ["fp16", "bf16", "tf32"])
def test_narrow_and_tf32_math(precision):
    ks, err = check_template(*dense(31, 67, 64, "gelu", seed=17), precision=precision)
    if precision == "tf32":
        # Operands are rounded to tf32 in the kernel, so the interpreter's fp32 dot computes the
        # tensor cores' products: the error is tf32's, not fp32's.
        assert 'input_precision="tf32"' in ks.source and err > 1e-5
    else:
        assert "input_precision" not in ks.source and "tl.dot(a" in ks.source
    ks, err = check_template(*dense(7, 13, 31, seed=18))
    assert 'input_precision="ieee"' in ks.source and err < 1e-6


@pytest.mark.parametrize("precision", ["fp32", "tf32", "fp16"])
def test_a_tf32_constant_weight_is_read_k_major(precision):
    # Hopper's wgmma reads tf32 operands only K-major, so a tf32 template reads a constant B that
    # only its dot reads from a copy stored [..., N, K]; other precisions keep the graph's order.
    tf32 = precision == "tf32"
    ks, _ = check_template(*dense(31, 67, 64, "gelu", seed=40), GemmSchedule(16, 32, 16, 2, 2, 1, 1),
                           precision=precision)
    assert ks.input_layouts == ({"w": (1, 0)} if tf32 else {})
    x = rand(3, 5, 131, seed=41)  # a batched constant weight, split-K over ragged K slices
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["out"])], {"x": x, "w": Const(rand(3, 131, 9, seed=42))},
                        ["out"])
    ks, _ = check_template(model, {"x": x}, GemmSchedule(16, 16, 32, 2, 2, 1, 3), precision=precision)
    assert ks.input_layouts == ({"w": (0, 2, 1)} if tf32 else {})
    x = rand(13, 13, seed=43)  # a weight the epilogue reads too stays as the graph stores it
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "w"], ["out"])],
                        {"x": x, "w": Const(rand(13, 13, seed=44))}, ["out"])
    ks, _ = check_template(model, {"x": x}, GemmSchedule(16, 16, 16, 2, 2, 1, 1), precision=precision)
    assert ks.input_layouts == {}


def test_an_elementwise_prologue_is_computed_at_the_operand():
    # The ground a prologue candidate needs (the orchestrator does not form them yet): relu(x * s + t)
    # computed at A's tile indices inside the K loop, s (constant along K) loaded once before it.
    # Its value is never stored: it has no place among the product's indices.
    x, sc = rand(13, 31, seed=50), rand(13, 1, seed=51)
    model = graph_model([helper.make_node("Mul", ["x", "s"], ["xs"]), helper.make_node("Add", ["xs", "t"], ["xt"]),
                         helper.make_node("Relu", ["xt"], ["xr"]), helper.make_node("MatMul", ["xr", "w"], ["out"])],
                        {"x": x, "s": sc, "t": Const(rand(31, seed=52)), "w": Const(rand(31, 17, seed=53))}, ["out"])
    g = fission(load(model).graph).graph
    og = build_ograph(g)
    prims = list(og.nodes)
    sched = GemmSchedule(16, 16, 16, 2, 2, 1, 1)
    ks = implement(g, prims, prologue_of(og, prims), ["out"], "k0_test", (), sched).triton
    loop = ks.source[ks.source.index("for k"):ks.source.index("tl.dot")]
    assert "tl.maximum" in loop and " * " in loop and "in1 + rm" not in loop  # s: outside the loop
    feeds = {"x": x, "s": sc}
    got = run_template(g, ks, {**g.constants, **feeds})
    assert rel_l2(got["out"], interp.run(g, feeds, exact=True)["out"]) < TOLERANCE["fp32"]
    relu = next(n for n in prims if n.op == "max").outputs[0]
    with pytest.raises(Unsupported, match="not computed from the matmul"):
        implement(g, prims, prologue_of(og, prims), ["out", relu], "k0_test", (), sched)


def _prologue_kernel(model: onnx.ModelProto, feeds: dict[str, np.ndarray], sched: GemmSchedule) -> KernelSource:
    """The whole (one-matmul) model as one template kernel with its operand prologue, checked against
    the float64 reference; the kernel is legal for the orchestrator only with prologues."""
    from tessera.orchestrate.candidates import StructuralLegality

    g = fission(load(model).graph).graph
    og = build_ograph(g)
    assert StructuralLegality(prologues=True).check(og, og.all) is None
    assert StructuralLegality().check(og, og.all) is not None
    prims = list(og.nodes)
    ks = implement(g, prims, prologue_of(og, prims), list(g.outputs), "k0_test", (), sched).triton
    got = run_template(g, ks, {**g.constants, **feeds})
    for o in g.outputs:
        assert rel_l2(got[o], interp.run(g, feeds, exact=True)[o]) < TOLERANCE["fp32"]
    return ks


def test_layout_prologues_transpose_and_bias():
    # Attention's scores: (q + b) @ transpose(k) over a batch of heads, with q's bias add and k's
    # transpose computed as the tiles load: no copy kernel for K^T or the bias (issue 14).
    q, k = rand(2, 13, 24, seed=70), rand(2, 19, 24, seed=71)
    model = graph_model([helper.make_node("Add", ["q", "b"], ["qb"]),
                         helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                         helper.make_node("MatMul", ["qb", "kt"], ["out"])],
                        {"q": q, "k": k, "b": Const(rand(24, seed=72))}, ["out"])
    ks = _prologue_kernel(model, {"q": q, "k": k}, GemmSchedule(16, 16, 16, 2, 2, 1, 1))
    assert "transpose" in ks.source


def test_layout_prologues_slice_pad_and_concat():
    # [x[:, 1:18] padded by one column each side, y] @ w: the operand assembled while it loads.
    x, y = rand(13, 20, seed=73), rand(13, 5, seed=74)
    model = graph_model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["xs"]),
                         helper.make_node("Pad", ["xs", "pads"], ["xp"]),
                         helper.make_node("Concat", ["xp", "y"], ["a"], axis=1),
                         helper.make_node("MatMul", ["a", "w"], ["out"])],
                        {"x": x, "y": y, "st": Const(np.array([1], np.int64)), "en": Const(np.array([18], np.int64)),
                         "ax": Const(np.array([1], np.int64)), "pads": Const(np.array([0, 1, 0, 1], np.int64)),
                         "w": Const(rand(24, 11, seed=75))}, ["out"])
    ks = _prologue_kernel(model, {"x": x, "y": y}, GemmSchedule(16, 16, 16, 2, 2, 1, 1))
    assert "concat" in ks.source and "pad" in ks.source


def test_a_transpose_prologue_fuses_into_a_measured_template(tmp_path, monkeypatch):
    # (q + b) @ transpose(k): with templates measured, the binary program may put the bias add and
    # the transpose in the matmul's kernel; the artifact reloads and matches onnxruntime.
    prof = TemplatePrologueProfiler(GemmSchedule)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake-gpu")
    monkeypatch.setattr(compiler, "new_profiler", lambda opt: prof)
    q, k = rand(2, 13, 24, seed=78), rand(2, 19, 24, seed=79)
    model = graph_model([helper.make_node("Add", ["q", "b"], ["qb"]),
                         helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
                         helper.make_node("MatMul", ["qb", "kt"], ["out"])],
                        {"q": q, "k": k, "b": Const(rand(24, seed=80))}, ["out"])
    result = compile_model(model, CompileOptions(cost="measured", db=str(tmp_path / "t.db")))
    (kern,) = result.kernels
    assert kern.backend == "template" and {n.op for n in kern.prims} >= {"add", "transpose", "matmul"}
    assert result.tuning["failed"] == 0
    feeds = {"q": q, "k": k}
    write_artifacts(result, tmp_path / "art")
    got = run_exe(tessera.load(tmp_path / "art", DEVICE), feeds)[0]
    assert rel_l2(got, run_onnxruntime(model, feeds)["out"]) < TOLERANCE["fp32"]


def test_an_epilogue_takes_no_layout_primitive():
    from tessera.orchestrate.candidates import StructuralLegality

    x = rand(13, 24, seed=76)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]),
                         helper.make_node("Transpose", ["y"], ["out"], perm=[1, 0])],
                        {"x": x, "w": Const(rand(24, 11, seed=77))}, ["out"])
    og = build_ograph(fission(load(model).graph).graph)
    assert "cannot join a linear kernel" in StructuralLegality(prologues=True).check(og, og.all)


def test_cast_and_multi_output_epilogue():
    # The product, the biased value and the activation are all written; one output is a cast.
    x = rand(13, 31, seed=19)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
                         helper.make_node("Gelu", ["z"], ["g"]),
                         helper.make_node("Cast", ["g"], ["h"], to=onnx.TensorProto.FLOAT16)],
                        {"x": x, "w": Const(rand(31, 67, seed=20)), "b": Const(rand(67, seed=21))}, ["y", "z", "h"])
    g32 = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g32)
    ks = implement(g32, prims, pro, outputs, "k0", (), GemmSchedule(16, 32, 16, 2, 2, 1, 1)).triton
    assert len(ks.outputs) == 3 and ks.source.count("tl.store(") == 3
    got = run_template(g32, ks, {**g32.constants, "x": x})
    ref = interp.run(g32, {"x": x}, exact=True)
    for t in ("y", "z"):
        assert rel_l2(got[t], ref[t]) < TOLERANCE["fp32"]
    assert rel_l2(got["h"], ref["h"]) < TOLERANCE["fp16"]


@pytest.mark.parametrize("schedule", [GemmSchedule(16, 16, 16, 2, 2, 1, 1), GemmSchedule(16, 32, 16, 2, 2, 1, 3)])
def test_an_epilogue_writes_slices_of_the_product(schedule):
    # A merged QKV projection: one product, its column thirds written as three outputs, each with
    # its own bias; the slice boundaries (23, 46) fall inside tiles, and K is split in one case.
    x = rand(2, 13, 31, seed=81)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Split", ["y", "sizes"], ["q", "k", "v"], axis=-1)]
    for t in "qkv":
        nodes.append(helper.make_node("Add", [t, f"b{t}"], [f"{t}b"]))
    nodes.append(helper.make_node("Relu", ["vb"], ["vr"]))
    inits = {"x": x, "w": Const(rand(31, 69, seed=82)), "sizes": Const(np.array([23, 23, 23], np.int64)),
             **{f"b{t}": Const(rand(23, seed=83 + i)) for i, t in enumerate("qkv")}}
    model = graph_model(nodes, inits, ["qb", "kb", "vr"])
    g32 = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g32)
    assert {n.op for n in prims} >= {"slice", "add"}
    ks = implement(g32, prims, pro, outputs, "k0", (), schedule).triton
    assert len(ks.outputs) == 3 and ks.source.count("tl.store(out") == 3
    got = run_template(g32, ks, {**g32.constants, **interp.run(g32, {"x": x}, keep_all=True)})
    ref = interp.run(g32, {"x": x}, exact=True, keep_all=True)
    for t in outputs:
        assert rel_l2(got[t], ref[t]) < TOLERANCE["fp32"], t


def test_an_epilogue_slice_with_a_stride_stays_out():
    from tessera.orchestrate.candidates import StructuralLegality

    x = rand(13, 24, seed=84)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]),
                         helper.make_node("Slice", ["y", "st", "en", "ax", "sp"], ["out"])],
                        {"x": x, "w": Const(rand(24, 12, seed=85)), "st": Const(np.array([0], np.int64)),
                         "en": Const(np.array([12], np.int64)), "ax": Const(np.array([1], np.int64)),
                         "sp": Const(np.array([2], np.int64))}, ["out"])
    og = build_ograph(fission(load(model).graph).graph)
    assert "slice cannot join a linear kernel" in StructuralLegality(prologues=True).check(og, og.all)


@pytest.mark.parametrize("split", [2, 3, 4])
def test_split_k(split):
    # Long K over few tiles: slices of K into a workspace; each tile's last program sums them and
    # runs the whole epilogue, in the same launch.
    model, feeds = dense(7, 13, 67 * 4 + 3, "gelu", seed=22)
    ks, _ = check_template(model, feeds, GemmSchedule(16, 16, 16, 2, 2, 1, split))
    assert len(ks.launches) == 1 and ks.workspace == split * 7 * 13 + 1  # the partials, one tile's counter
    assert "tl.atomic_add(" in ks.source
    a, b = rand(3, 5, 131, seed=23), rand(3, 131, 9, seed=24)
    model = graph_model([helper.make_node("MatMul", ["a", "b"], ["y"]), helper.make_node("Relu", ["y"], ["out"])],
                        {"a": a, "b": b}, ["out", "y"])
    check_template(model, {"a": a, "b": b}, GemmSchedule(16, 16, 32, 2, 2, 1, split), precision="bf16")


def test_split_k_counters_return_to_zero():
    # The last program resets its tile's counter, so a second launch (a CUDA-graph replay) sums
    # its own slices again: the same bits, and counters at 0 after each.
    model, feeds = dense(19, 37, 301, "relu", seed=25)
    g = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g)
    ks = implement(g, prims, pro, outputs, "k0", (), GemmSchedule(16, 16, 16, 2, 2, 1, 3)).triton
    kernel, args, outs = template_launch(g, ks, {**g.constants, **interp.run(g, feeds, keep_all=True)})
    kernel(*args, *outs)
    first = [o.clone() for o in outs]
    kernel(*args, *outs)
    assert all(torch.equal(a, b) for a, b in zip(first, outs))
    tiles = 2 * 3  # ceil(19 / 16) x ceil(37 / 16)
    assert kernel.workspace is not None and kernel.workspace[-tiles:].abs().sum().item() == 0


def test_no_template_form():
    # Integer products and kernels without a matmul have none; the generator says why.
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    g = fission(load(graph_model([helper.make_node("MatMul", ["a", "b"], ["out"])],
                                 {"a": a, "b": Const(a.T.copy())}, ["out"])).graph).graph
    prims, pro, outs = matmul_kernel(g)
    with pytest.raises(Unsupported, match="fp32, fp16 or bf16"):
        implement(g, prims, pro, outs, "k0", (), GemmSchedule(16, 16, 16))
    g = fission(load(graph_model([helper.make_node("Relu", ["x"], ["out"])], {"x": rand(3, 4)}, ["out"])).graph).graph
    with pytest.raises(Unsupported, match="without a matmul"):
        implement(g, g.nodes, [], list(g.outputs), "k0", (), GemmSchedule(16, 16, 16))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_an_epilogue_transpose_is_a_permuted_store(precision):
    # A product over pixel rows put back in NCHW order (a 1x1 convolution as a matmul,
    # rewrite/rules/pointwise_conv.py): the template stores its tile at the transposed indices
    # instead of running a transpose kernel after it. The ReLU between reads the product in place.
    x = rand(2 * 7 * 9, 20, seed=4)
    model = graph_model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
                         helper.make_node("Reshape", ["r", "s"], ["yr"]),
                         helper.make_node("Transpose", ["yr"], ["out"], perm=[0, 3, 1, 2])],
                        {"x": x, "w": Const(rand(20, 24, seed=5)), "s": Const(np.array([2, 7, 9, 24], np.int64))},
                        ["out"], opset=13)
    ks, _ = check_template(model, {"x": x}, GemmSchedule(16, 16, 16, 2, 2), precision)
    assert "(transpose)" in ks.source and ks.source.count("tl.store(") == 1


# ---- schedules -----------------------------------------------------------------------------------
def test_schedule_space_keys_and_json():
    for shape in [(1, 1, 1, 1), (1, 13, 7, 31), (1, 128, 512, 128), (12, 512, 512, 64), (1, 16, 17, 16384),
                  (1, 4096, 4096, 4096)]:
        for itemsize in (2, 4):
            space = template_schedules(*shape, itemsize=itemsize)
            assert 1 <= len(space) <= 100 and len(set(space)) == len(space)
            assert all(min(s.block_m, s.block_n, s.block_k) >= 16 for s in space)
    assert any(s.split_k > 1 for s in template_schedules(1, 16, 17, 16384))  # small M*N, long K
    assert not any(s.split_k > 1 for s in template_schedules(1, 4096, 4096, 4096))
    s = GemmSchedule(64, 128, 32, 4, 3, 8, 2)
    assert _schedule_key(s) == "gemm-m64-n128-k32-w4-s3-g8-sk2-1l"  # one launch: apart from the old two-launch times
    assert _schedule_key(GemmSchedule(64, 128, 32, 4, 3, 8, 1)) == "gemm-m64-n128-k32-w4-s3-g8-sk1"
    assert _schedule_key(Schedule(1024, 1, 4)) == "x1024-r1-w4-p"  # generated kernels' keys are unchanged
    assert schedule_from_json(json.loads(json.dumps(s.to_json()))) == s
    assert schedule_from_json(Schedule(64, 32, 8, False).to_json()) == Schedule(64, 32, 8, False)
    assert "form" not in Schedule(64).to_json()


def test_small_tiles_of_four_byte_operands_keep_four_warps():
    # Session 38's H100 sweep: in tf32, 4 warps ran 32x32 tiles in a median 0.84 of 2 warps' time;
    # 16-bit operands showed no gain, so their small tiles keep the one-warp-per-512-outputs cut.
    def warps(itemsize):
        return {(s.block_m, s.block_n): s.num_warps for s in template_schedules(1, 512, 256, 256, itemsize=itemsize)}
    assert warps(4)[(32, 32)] == 4 and warps(4)[(16, 64)] == 4 and warps(4)[(16, 32)] == 2
    assert warps(2)[(32, 32)] == 2 and warps(2)[(16, 32)] == 2


def test_the_ranking_leads_with_one_schedule_per_tile_shape():
    # The model orders schedules of one tile shape well and shapes apart poorly (session 21's H100
    # probe), so the best-ranked schedule of each of its first GEMM_FAMILIES shapes leads.
    from tessera.cost.schedule_model import GEMM_FAMILIES, family_heads

    model, _ = dense(128, 768, 3072, "relu", seed=3)
    g = fission(load(model).graph).graph
    prims, pro, outputs = matmul_kernel(g)
    ranked = rank_templates(g, pro + prims, outputs, "tf32")
    heads = ranked[:GEMM_FAMILIES]
    assert len({(s.block_m, s.block_n) for s in heads}) == GEMM_FAMILIES
    assert sorted(ranked, key=str) == sorted(template_schedules(1, 128, 768, 3072), key=str)  # a reordering
    assert family_heads(heads + heads[:1]) == heads  # heads stay first and are not repeated
    rest = ranked[GEMM_FAMILIES:]
    assert all(ranked.index(h) < GEMM_FAMILIES for h in heads) and not set(heads) & set(rest)


def test_candidates_around_one_matmul_measure_its_fastest_schedule_once(tmp_path):
    """The first template candidate of a matmul is measured at GEMM_FAMILIES schedules; every other
    candidate around the same matmul (more or less of the epilogue fused) at the first one's fastest."""
    from fake_profiler import core_measurements

    from tessera.codegen.select import TritonLegality
    from tessera.cost.schedule_model import GEMM_FAMILIES
    from tessera.orchestrate.candidates import CandidateRules

    model, _ = dense(40, 72, 300, "gelu", seed=9)
    og = build_ograph(fission(load(model).graph).graph)
    seen, best = core_measurements(og, GemmSchedule, CandidateRules(max_linear=1), TritonLegality(templates=True),
                                   tmp_path / "t.db")
    firsts = [s for s, v in seen.items() if len(v) == GEMM_FAMILIES]
    assert len(firsts) == 1 and len(seen) > 1  # one matmul, several candidates around it
    (first,) = firsts
    assert all(v == [next(s for s in seen[first] if _schedule_key(s) == best)] for sig, v in seen.items() if sig != first)


def test_the_smallest_candidate_around_a_matmul_claims_its_core(tmp_path):
    # Its schedules are the ones measured (its twins get its fastest), so it must be the matmul with
    # the least around it: a GELU-prologue twin's fastest tile once priced BERT's plain MLP-down GEMM
    # at 10.6 µs against its own 6.5 (session 33).
    from collections import defaultdict

    from tessera.codegen.select import TritonLegality
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import MeasuredCost
    from tessera.cost.schedule_model import GEMM_FAMILIES
    from tessera.orchestrate import orchestrate
    from tessera.orchestrate.candidates import CandidateRules

    # x @ w1 + b -> GELU -> @ w2: the GELU may ride in the second matmul as its operand prologue
    x, w1, b, w2 = rand(40, 64, seed=1), rand(64, 96, seed=2), rand(96, seed=3), rand(96, 48, seed=4)
    model = graph_model([helper.make_node("MatMul", ["x", "w1"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"]),
                         helper.make_node("Gelu", ["z"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["out"])],
                        {"x": x, "w1": Const(w1), "b": Const(b), "w2": Const(w2)}, ["out"], opset=20)
    og = build_ograph(fission(load(model).graph).graph)
    timed: dict[str, list] = defaultdict(list)
    size: dict[str, int] = {}

    class Profiler:
        def measure(self, jobs, record):
            for i, j in enumerate(jobs):
                if isinstance(j.schedule, GemmSchedule):
                    timed[j.key.signature].append(j.schedule)
                    size[j.key.signature] = len(j.prims) + len(j.prologue)
                record(i, 1e-5, "")

    with TuningDB(tmp_path / "t.db") as db:
        orchestrate(og, MeasuredCost(og, db, Profiler(), "fake", "v1", templates=True),
                    rules=CandidateRules(max_linear=1), legality=TritonLegality(templates=True))
    firsts = [s for s, v in timed.items() if len(v) == GEMM_FAMILIES]  # one per matmul
    assert len(firsts) == 2 and len(size) > 2
    assert all(size[sig] == 1 for sig in firsts)  # each plain matmul claimed its core, not a twin with the GELU in front
