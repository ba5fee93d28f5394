"""The graphs the fuzzer found bugs with, each shrunk as Hypothesis printed it, with the fix it led to:
`REGRESSIONS` run on the CPU and `GPU_REGRESSIONS` on CUDA (tests/test_fuzz.py runs both)."""
from __future__ import annotations

from fuzzspec import C, GraphSpec, N, T

# ---- bugs the fuzzer found: each shrunk graph, as Hypothesis printed it ----------------------------
REGRESSIONS = {
    # rewrite/precision.py: under fp16/bf16 an input nothing reads got a cast whose kernel had no
    # outputs (codegen: "max() arg is an empty sequence").
    "unused_input_half": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in2", (1,), "float32")], consts=[],
        nodes=[N("Relu", ["in2"], ["t3"], family="elementwise")], outputs=["t3"]),
    # Triton's interpreter truncated float32 -> bfloat16 (the GPU rounds to nearest even): x * x
    # was 1.4% off (codegen/interpreter.py).
    "bf16_rounding": GraphSpec(
        opset=13, precision="bf16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32")], consts=[],
        nodes=[N("Mul", ["in1", "in1"], ["t2"], family="elementwise")], outputs=["t2"]),
    # An int64 -> bfloat16 cast: the interpreter read the integer's bits as a bfloat16 (-1 became
    # NaN). Integers now reach a narrow float through float32 (codegen/triton_ops.py: _cast).
    "int_to_bf16_cast": GraphSpec(
        opset=13, precision="bf16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in4", (1,), "int64")], consts=[],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"), N("IsNaN", ["t2"], ["t3"], family="compare"),
               N("Cast", ["in4"], ["t5"], {"to": 1}, family="cast")],
        outputs=["t5", "t3"], index_bounds={"in4": (-6, 6)}),
    # A pooling window over an axis with one output and padding: its bound check depends on the
    # window counter only, which the interpreter typed int32 ("mask has unsupported dtype").
    "pool_scalar_mask": GraphSpec(
        opset=21, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in2", (1, 3, 33, 2), "float32")], consts=[],
        nodes=[N("MaxPool", ["in2"], ["t3"], {"kernel_shape": [2, 2], "strides": [1, 2], "pads": [0, 1, 0, 0]},
                 family="pooling")], outputs=["t3"]),
    # orchestrate/greedy.py: two convex greedy groups read each other (both fp16 input casts fused
    # into them), "the greedy plan must be executable".
    "greedy_group_cycle": GraphSpec(
        opset=17, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 3, 3), "float32"), T("in5", (1, 3, 3), "float32")],
        consts=[C("c2", (3,), "float32"), C("c3", (3,), "float32", scale=0.5)],
        nodes=[N("InstanceNormalization", ["in1", "c2", "c3"], ["t4"], {"epsilon": 1e-05}, family="normalization"),
               N("Greater", ["in1", "in5"], ["t6"], family="compare"),
               N("Relu", ["in5"], ["t7"], family="elementwise"),
               N("Add", ["t7", "t4"], ["t8"], family="elementwise")],
        outputs=["t8", "t6"]),
    # rewrite/precision.py: an opaque op's constant inputs were rounded to the narrow type and cast
    # back: a bf16 Resize scale of 1.7 became 1.703125 and moved every sample (1.2% off).
    "opaque_constant_keeps_fp32": GraphSpec(
        opset=17, precision="bf16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in2", (1, 3, 2, 8), "float32")],
        consts=[C("c3", (0,), "float32", values=(), data=False),
                C("c4", (4,), "float32", values=(1.0, 1.0, 1.0, 1.7), data=False)],
        nodes=[N("Resize", ["in2", "c3", "c4"], ["t5"], {"mode": "cubic", "coordinate_transformation_mode": "half_pixel"},
                 family="resize")], outputs=["t5"]),
    # codegen/emitter.py: a Where whose condition is a FILL (Dropout's mask) was written
    # tl.where(1, ...), an int32 condition that Triton deprecates (a warning now, an error later).
    "where_constant_condition": GraphSpec(
        opset=17, precision="fp32", layout="auto", strategy="optimal", seed=1, schedule_seed=0,
        inputs=[T("x", (3, 5), "float32"), T("z", (3, 5), "float32")], consts=[],
        nodes=[N("Dropout", ["x"], ["d", "m"]), N("Where", ["m", "x", "z"], ["y"], family="compare")],
        outputs=["y", "d"]),
    # rewrite/precision.py: an opaque op reading one tensor twice got two casts writing one tensor
    # ("tensor ... is written twice"). Found with Mean(t7, t7); Mean has lowered since session 50 and
    # Einsum since 51, so a CastLike (no fission rule) reads the tensor twice here.
    "opaque_duplicate_input": GraphSpec(
        opset=17, precision="fp16", layout="nhwc", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 1, 5), "float32"), T("in4", (1, 3, 2, 2), "float32")],
        consts=[C("c5", (4, 3, 1, 1), "float32", scale=0.5773502691896258)],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"), N("Relu", ["t2"], ["t3"], family="elementwise"),
               N("Conv", ["in4", "c5"], ["t6"], family="conv"),
               N("MaxPool", ["t3"], ["t7"], {"kernel_shape": [2]}, family="pooling"),
               N("CastLike", ["t7", "t7"], ["t8"], family="opaque")],
        outputs=["t8", "t6"]),
    # rewrite/precision.py: the cast of an opaque op's unused float output (TopK's values, when only
    # its indices are read) was a kernel with no outputs. (Found with k = 1 of 1; TopK lowers up to k = 16
    # since session 51, so here k = 17 keeps it opaque.)
    "opaque_unused_output": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (17,), "float32"), T("in11", (1,), "float32")],
        consts=[C("c6", (1,), "int64", values=(17,), data=False)],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"), N("Relu", ["t2"], ["t3"], family="elementwise"),
               N("Relu", ["t3"], ["t4"], family="elementwise"), N("Relu", ["t4"], ["t5"], family="elementwise"),
               N("TopK", ["t5", "c6"], ["t7", "t8"], family="opaque"), N("Relu", ["t5"], ["t9"], family="elementwise"),
               N("Relu", ["t5"], ["t10"], family="elementwise"), N("Relu", ["in11"], ["t12"], family="elementwise")],
        outputs=["t12", "t10", "t9", "t8"]),
    # orchestrate/layout.py (_pad_matmuls, new in this session): A @ A padded one tensor twice under
    # one name ("two nodes are named 'in2/k20/pad'"); fixed there by naming each padded dim.
    "matmul_same_operand_padded": GraphSpec(
        opset=13, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 1, 1, 1), "float32"), T("in2", (3, 5, 17, 17), "float32")], consts=[],
        nodes=[N("MatMul", ["in2", "in2"], ["t3"], family="linear")], outputs=["t3"]),
    # rewrite/precision.py: under fp16 an output that folds to a constant (Relu(|c| + 0.25)) was
    # returned as float16, though the model declares float32 (found on the H100, 2026-11-24).
    "constant_output_keeps_its_dtype": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in3", (1, 4, 1, 1), "float32")],
        consts=[C("c5", (1, 1, 2, 2), "float32"), C("c7", (), "float32", values=(0.25,))],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"),
               N("DepthToSpace", ["in3"], ["t4"], {"blocksize": 2, "mode": "DCR"}, family="layout"),
               N("Abs", ["c5"], ["t6"], family="elementwise"), N("Add", ["t6", "c7"], ["t8"], family="elementwise"),
               N("Tanh", ["t4"], ["t9"], family="elementwise"), N("Pow", ["t8", "t9"], ["t10"], family="elementwise"),
               N("Relu", ["t10"], ["t11"], family="elementwise"), N("Relu", ["t8"], ["t12"], family="elementwise")],
        outputs=["t12", "t11", "t2"]),
    # codegen/select.py (_library_epilogue): a bf16 1x1 Conv whose one output channel the layout pass
    # padded to 8: the SLICE cutting it back sat between the library call and the bias add, so a
    # generated kernel added the bias to the sum already rounded to bf16; the bias nearly cancels
    # it (2.2% off, the emulated bf16 executor 0.11%). The call now adds the bias zero-padded, then
    # cuts (session 35, scripts/results/fuzz/session35/fuzz_19f90ba.fail1.json).
    "bf16_conv_bias_after_padded_channels": GraphSpec(
        opset=17, precision="bf16", layout="auto", strategy="optimal", seed=1014, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in2", (1, 1, 1), "float32"), T("in6", (1, 8, 2, 5), "float32")],
        consts=[C("c3", (1,), "float32"), C("c4", (1,), "float32", scale=0.5),
                C("c7", (1, 8, 1, 1), "float32", scale=0.35355339059327373), C("c8", (1,), "float32", scale=0.5)],
        nodes=[N("InstanceNormalization", ["in2", "c3", "c4"], ["t5"], {"epsilon": 1e-05}, family="normalization"),
               N("Conv", ["in6", "c7", "c8"], ["t9"], family="conv"), N("Relu", ["t9"], ["t10"], family="conv"),
               N("Relu", ["t10"], ["t11"], family="elementwise"), N("Relu", ["t11"], ["t12"], family="elementwise")],
        outputs=["t12", "t5"]),
    # codegen/emitter.py: an elementwise primitive of literals only (BatchNorm's variance + epsilon)
    # was made a tensor as tl.full([1], ...), rank 1 though its value has no index: in a row
    # reduction kernel (2-D blocks) over a 1x1 input, whose one element is a scalar load, the
    # normalized value stayed rank 1 and storing it as the second output, tl.broadcast_to(v,
    # [XBLOCK, 1]), failed ("Cannot broadcast, rank mismatch"). Literals become 0-d tensors now
    # (session 36, fz36.fail1).
    "literal_tensor_rank_in_row_reduction": GraphSpec(
        opset=17, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 1), "float32")],
        consts=[C("c2", (1,), "float32"), C("c3", (1,), "float32", scale=0.5), C("c4", (1,), "float32", scale=0.5),
                C("c5", (1,), "float32", positive=True)],
        nodes=[N("BatchNormalization", ["in1", "c2", "c3", "c4", "c5"], ["t6"], {"epsilon": 1e-05},
                 family="normalization"),
               N("Softmax", ["t6"], ["t7"], family="normalization"), N("Relu", ["t7"], ["t8"], family="elementwise"),
               N("Relu", ["t8"], ["t9"], family="elementwise")],
        outputs=["t9", "t6"]),
    # codegen/select.py (_library_epilogue): a bf16 Gemm of one row and one column, beta 0.5. Its bias
    # needs no broadcast to the [1, 1] result, and only a broadcast bias was given to the library
    # call, so a generated kernel added it to the product already rounded to bf16; the bias nearly
    # cancels the product (1.6% off, the emulated bf16 executor 0.05%). A bias already shaped as
    # one vector along the output's columns is the call's too now (session 41,
    # scripts/results/fuzz/session41/fuzz_2026-11-28_32130b2.fail1.json).
    "bf16_gemm_bias_without_broadcast": GraphSpec(
        opset=13, precision="bf16", layout="auto", strategy="optimal", seed=5, schedule_seed=0,
        inputs=[T("in1", (1, 2), "float32")],
        consts=[C("c2", (2, 1), "float32", scale=0.7071067811865475), C("c3", (1,), "float32")],
        nodes=[N("Gemm", ["in1", "c2", "c3"], ["t4"], {"beta": 0.5}, family="linear")], outputs=["t4"]),
    # codegen/triton_ops.py (_cast): a cast between float16 and bfloat16 was taken for a widening
    # (one size, one compute type) and emitted as no cast, so in an fp16 plan x - float(bfloat16(x))
    # was 0 where onnxruntime gives the rounding step (session 44,
    # scripts/results/fuzz/session44/fuzz_4401.fail1.json).
    "fp16_plan_bfloat16_round_trip": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32")], consts=[],
        nodes=[N("Cast", ["in1"], ["t2"], {"to": 16}, family="cast"), N("Cast", ["t2"], ["t3"], {"to": 1}, family="cast"),
               N("Sub", ["t3", "in1"], ["t4"], family="elementwise")], outputs=["t4"]),
    # orchestrate/candidates.py (bias_groups), codegen/select.py (_library_epilogue): an fp16 Gemm
    # whose C is a graph input. The plan wrote the library product, rounded to fp16, and a generated
    # kernel added C to it; C nearly cancels the product (1.2% off, the emulated fp16 executor
    # 0.026%). A narrow plan now never writes a product before its own node's bias add, and the
    # library call takes a C computed by another kernel, a whole [M, N] one too (sessions 44-45,
    # scripts/results/fuzz/session44/fuzz_4411.fail1.json, also seeds 4421 and 4431).
    "fp16_gemm_bias_from_input": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=84, schedule_seed=0,
        inputs=[T("in1", (2, 12), "float32"), T("in4", (1,), "float32")],
        consts=[C("c3", (12, 1), "float32", scale=0.2886751345948129)],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"), N("Gemm", ["t2", "c3", "in4"], ["t5"], family="linear"),
               N("Relu", ["t5"], ["t6"], family="elementwise")], outputs=["t6"]),
    # ir/interp_opaque.py: numpy's ascontiguousarray makes a 0-d array 1-d, so onnxruntime ran an opaque
    # node on [1]-shaped feeds and answered [1] where the graph declares a scalar ("computed shape [1],
    # the graph declares []"); the same call gave scalar constants, erf's operand and verify's feeds a
    # dimension (session 46, scripts/results/fuzz/session46/fuzz_4601.fail1.json). The host step was a Mod
    # of two scalars; Mod has lowered since session 51, so it is a ReduceProd of one here.
    "opaque_on_scalars": GraphSpec(
        opset=13, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in3", (), "int64")], consts=[C("c6", (), "int64", values=(1,))],
        nodes=[N("Abs", ["in3"], ["t5"], family="integer"), N("Add", ["t5", "c6"], ["t7"], family="integer"),
               N("ReduceProd", ["t7"], ["t8"], {"keepdims": 0}, family="opaque")],
        outputs=["t8"], index_bounds={"in3": (-6, 6)}),
    # runtime/concat_alias.py: a concatenation reading another one's output, whose pieces its producers
    # wrote in place, made that output a piece too; the executable failed to build (KeyError; session 48,
    # scripts/results/fuzz/session48/fuzz_4803_half.fail1.json). The outer one now copies.
    "nested_concat_in_place": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32")], consts=[],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"),
               N("Concat", ["t2", "in1"], ["t3"], {"axis": 0}, family="layout"),
               N("Relu", ["t3"], ["t4"], family="elementwise"), N("Relu", ["t4"], ["t5"], family="elementwise"),
               N("Concat", ["t3", "t5"], ["t6"], {"axis": 0}, family="layout")],
        outputs=["t6"], kernel_nodes=1),
    # runtime/torch_prims.py: torch 2.13's CPU bfloat16 depthwise convolution (two filters a channel,
    # strides (1, 2), a few columns) is wrong on channels-last data; the nhwc plan gave rel L2 1.06
    # (session 48, scripts/results/fuzz/session48/fuzz_4803_half.fail2.json).
    "bf16_depthwise_channels_last_on_cpu": GraphSpec(
        opset=13, precision="bf16", layout="nhwc", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 1, 5, 1), "float32")],
        consts=[C("c2", (4, 1, 1, 1), "float32"), C("c4", (8, 1, 3, 3), "float32", scale=1 / 3)],
        nodes=[N("Conv", ["in1", "c2"], ["t3"], family="conv"),
               N("Conv", ["t3", "c4"], ["t5"], {"strides": [1, 2], "pads": [0, 0, 0, 2], "group": 4}, family="conv")],
        outputs=["t5"], kernel_nodes=0),
    # runtime/torch_prims.py (`_convolve`): torch 2.13's CPU bfloat16 convolution of [2, 1, 8, 5] by [4, 1, 3, 5]
    # filters at strides (1, 2), a single output column, is 115% off (row-major too; found under --tuning fake,
    # session 56, scripts/results/fuzz/session56/fuzz_fake_5605.fail2.json; analytical plans fail the same)
    "bf16_conv_single_column_on_cpu": GraphSpec(
        opset=13, precision="bf16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in2", (2, 4, 3, 1), "float32")],
        consts=[C("c4", (1, 1, 2, 2), "float32", scale=0.5), C("c7", (1, 1, 2, 2), "float32", scale=0.5),
                C("c9", (4, 1, 3, 5), "float32", scale=0.2581988897471611)],
        nodes=[N("DepthToSpace", ["in2"], ["t3"], {"blocksize": 2, "mode": "DCR"}, family="layout"),
               N("ConvTranspose", ["t3", "c4"], ["t5"], {"strides": [1, 1], "pads": [0, 0, 0, 0]}, family="conv"),
               N("Relu", ["t5"], ["t6"], family="elementwise"),
               N("ConvTranspose", ["t6", "c7"], ["t8"], {"strides": [1, 1], "pads": [0, 0, 0, 0]}, family="conv"),
               N("Conv", ["t8", "c9"], ["t10"], {"strides": [1, 2], "pads": [0, 0, 0, 1]}, family="conv"),
               N("Relu", ["t10"], ["t11"], family="conv")],
        outputs=["t11"], kernel_nodes=0),
    # runtime/executable.py (`_padded_bias`): an fp16 Gemm whose scalar C went into the library call, with
    # the columns padded 11 -> 16, had C zero-padded as a 16-column vector: only the first column got it
    # (rel L2 0.117; session 49, scripts/results/fuzz/session49/fuzz_4901.fail1.json).
    "scalar_bias_padded_columns": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in2", (1, 513), "float32"), T("in3", (1, 11), "float32")], consts=[C("c4", (), "float32")],
        nodes=[N("Gemm", ["in2", "in3", "c4"], ["t5"], {"transA": 1}, family="linear")], outputs=["t5"]),
    # codegen/interpreter.py (`_boolean_comparison`): Triton's interpreter kept a scalar comparison's
    # operand type, so `x > 0.0` on a one-element input broadcast as float32, and `&` with a boolean
    # tensor raised "ufunc 'bitwise_and' not supported" (session 50, fuzz_5001.fail1.json).
    "scalar_comparison_and": GraphSpec(
        opset=13, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in4", (3,), "bool")], consts=[C("c2", (), "float32", values=(0.0,))],
        nodes=[N("Greater", ["in1", "c2"], ["t3"], family="compare"),
               N("And", ["t3", "in4"], ["t5"], family="compare")],
        outputs=["t5"]),
    # rewrite/precision.py (`_narrow_constant`): bfloat16 constants were held as unrounded float32, so a
    # one-element one, written into a kernel's source, kept float32's precision while larger ones were
    # rounded on their way to the GPU; a one-channel BatchNorm cancelled to 1.7% off the reference with
    # rounded constants (session 51, scripts/results/fuzz/session51/fuzz_5115.fail1.json).
    "bf16_one_element_constants_round": GraphSpec(
        opset=13, precision="bf16", layout="auto", strategy="optimal", seed=15078, schedule_seed=0,
        inputs=[T("in1", (1, 1), "float32")],
        consts=[C("c3", (1,), "float32"), C("c4", (1,), "float32", scale=0.5), C("c5", (1,), "float32", scale=0.5),
                C("c6", (1,), "float32", positive=True)],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"),
               N("BatchNormalization", ["t2", "c3", "c4", "c5", "c6"], ["t7"], {"epsilon": 1e-05},
                 family="normalization")],
        outputs=["t7"]),
    # runtime/buffers.py (`merged`): the plan computed t7 in two kernels that both wrote it; its two
    # lifetimes gave it two slabs and released the second twice, so the graph outputs t5 and t3 later
    # shared that slab and t5 read the LayerNorm's first value (session 52,
    # scripts/results/fuzz/session52/fuzz_5211.fail1.json).
    "a_value_two_kernels_write_keeps_its_slab": GraphSpec(
        opset=17, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (6,), "float32"), T("in4", (1,), "int64"), T("in8", (1, 3, 2), "float32")],
        consts=[C("c2", (6,), "float32"), C("c6", (1,), "int64", data=False, ints=(-6, 6))],
        nodes=[N("LayerNormalization", ["in1", "c2"], ["t3"], {"axis": 0}, family="normalization"),
               N("GatherND", ["in1", "in4"], ["t5"], family="gather"),
               N("GatherND", ["in1", "c6"], ["t7"], family="gather"),
               N("Relu", ["in8"], ["t9"], family="elementwise")],
        outputs=["t9", "t7", "t5", "t3"], index_bounds={"in4": (-6, 6)},
        types={"t5": ((), "float32"), "t7": ((), "float32")}),  # ONNX shape inference leaves them out
    # ops/resize.py, rewrite/precision.py: a bf16 plan stored a linear Resize's blend weights in
    # bfloat16, so the resized values (up to 0.013 off) put the one output 0.0104 off onnxruntime,
    # 7x the error of rounding after each node. The weights are the operator's own arithmetic and
    # now stay float32 (Graph.wide_constants), as PyTorch and onnxruntime compute them (session
    # 53, scripts/results/fuzz/session53/fuzz_5302.fail1.json).
    "resize_weights_stay_float32": GraphSpec(
        opset=17, precision="bf16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (2,), "float32"), T("in2", (1, 3, 65, 33), "float32")],
        consts=[C("c3", (4,), "float32", values=(1.0, 1.0, 2.0, 2.0), data=False),
                C("c7", (66, 1), "float32", scale=0.12309149097933272),
                C("c8", (1, 130), "float32", scale=0.08770580193070293),
                C("c10", (1, 1, 1, 1), "int64", data=False, ints=(-1, 1))],
        nodes=[N("Resize", ["in2", "", "c3"], ["t4"],
                 {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, family="resize"),
               N("Relu", ["t4"], ["t5"], family="elementwise"),
               N("Relu", ["t5"], ["t6"], family="elementwise"),
               N("MatMul", ["c8", "t6"], ["t9"], family="linear"),
               N("GatherElements", ["t9", "c10"], ["t11"], {"axis": 0}, family="gather")],
        outputs=["t11"]),
    # rewrite/precision.py: with one primitive per kernel, an fp16 plan stored ReduceLogSum's sum of
    # 67,600 values (about 80,000) as a float16 infinity before its log; onnxruntime gives 11.29.
    # An operator's own sums and squares now stay float32 (`internal_accumulations`) (session 54,
    # scripts/results/fuzz/session54/fuzz_5401.fail1.json).
    "an_operators_sum_stays_float32": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32"), T("in2", (1, 4, 65, 65), "float32")],
        consts=[C("c3", (16, 4, 1, 1), "float32", scale=0.5), C("c6", (), "float32", values=(0.5,))],
        nodes=[N("Conv", ["in2", "c3"], ["t4"], family="conv"),
               N("Abs", ["t4"], ["t5"], family="reduction"),
               N("Add", ["t5", "c6"], ["t7"], family="reduction"),
               N("ReduceLogSum", ["t7"], ["t8"], {"keepdims": 0}, family="reduction")],
        outputs=["t8"], kernel_nodes=1),
    # rewrite/precision.py: the fix above kept a LayerNorm's squares float32, but the rewrite search
    # (--rewrites on) had made their sum a product with ones, and a matmul takes one operand type:
    # "mat1 and mat2 must have the same dtype" at run time. Squares and sums read by a linear
    # primitive narrow as before (session 54, scripts/results/fuzz/session54/fuzz_5402.fail1.json).
    "squares_summed_by_a_matmul_narrow": GraphSpec(
        opset=17, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 3), "float32")], consts=[C("c2", (3,), "float32")],
        nodes=[N("LayerNormalization", ["in1", "c2"], ["t3"], {"axis": 1}, family="normalization"),
               N("Relu", ["t3"], ["t4"], family="elementwise")],
        outputs=["t4"], rewrites="on", kernel_nodes=1),
    # rewrite/precision.py: LRN sums its window of squares with adds of shifted slices, not a
    # REDUCE_SUM, so a plan of one primitive per kernel stored the partial sums as float16. Values
    # near 150 (squares near 22,500) overflowed at the second add and the result became 0, where
    # onnxruntime's is finite. The adds of an operator's own float32 sums are sums too (session 55).
    "an_lrns_window_sum_stays_float32": GraphSpec(
        opset=13, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 6, 3, 3), "float32")], consts=[C("c2", (), "float32", values=(150.0,))],
        nodes=[N("Mul", ["in1", "c2"], ["t3"], family="elementwise"),
               N("LRN", ["t3"], ["t4"], {"size": 5}, family="normalization")],
        outputs=["t4"], kernel_nodes=1),
}


# ---- bugs the fuzzer found on the GPU (H100, 2026-11-24), run on CUDA --------------------------------
GPU_REGRESSIONS = {
    # runtime/executable.py: an opaque primitive runs on the host (onnxruntime); capturing the plan
    # as one CUDA graph failed ("Cannot copy between CPU and CUDA tensors during CUDA graph
    # capture"). Plans with host steps are now captured as one graph per run of GPU steps.
    "opaque_only": GraphSpec(
        opset=17, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32")], consts=[],
        nodes=[N("Atan", ["in1"], ["t2"], family="opaque")], outputs=["t2"]),
    # (found as Greater, then Xor; Xor has lowered since session 50 and Sin since 51, so Atan is the host step here)
    "opaque_after_gpu": GraphSpec(
        opset=13, precision="fp32", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1,), "float32")], consts=[C("c2", (), "float32", values=(0.5,))],
        nodes=[N("Add", ["in1", "c2"], ["t3"], family="elementwise"),
               N("Atan", ["t3"], ["t4"], family="opaque")], outputs=["t4"]),
    # Host steps between GPU work on both sides, and a GPU output that stays live across them.
    "opaque_between_gpu": GraphSpec(
        opset=17, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (3, 37), "float32")], consts=[],
        nodes=[N("Relu", ["in1"], ["t2"], family="elementwise"), N("Atan", ["t2"], ["t3"], family="opaque"),
               N("Add", ["t3", "t2"], ["t4"], family="elementwise"), N("Asinh", ["t4"], ["t5"], family="opaque"),
               N("Mul", ["t5", "t2"], ["t6"], family="elementwise")], outputs=["t6", "t3"]),
}


# Graphs that failed under `scripts/fuzz.py --tuning fake` (a measured compile on the CPU whose profiler
# favours templates, `tests/fake_profiler.RandomTemplateProfiler`), checked the same way.
FAKE_TUNING_REGRESSIONS = {
    # rewrite/bias_after.py: a LayerNorm's beta moved after its projection as b @ W, kept float32 (a wide
    # constant) in an fp16 plan; the plan ran the projection as the library call with b @ W as its bias,
    # which torch refuses beside float16 operands ("self and mat2 must have the same dtype"; session 56,
    # scripts/results/fuzz/session56/fuzz_fake_5607.fail2.json). b @ W is now stored in the plan's type.
    "bias_after_in_the_library_call": GraphSpec(
        opset=17, precision="fp16", layout="auto", strategy="optimal", seed=0, schedule_seed=0,
        inputs=[T("in1", (1, 2, 1, 5), "float32"), T("in2", (3,), "float32")],
        consts=[C("c4", (5,), "float32"), C("c5", (5,), "float32", scale=0.5),
                C("c7", (5, 1), "float32", scale=0.4472135954999579), C("c9", (1,), "float32", scale=0.5),
                C("c11", (4,), "int64", values=(1, 1, 2, 2), data=False)],
        nodes=[N("Add", ["in2", "in2"], ["t3"], family="elementwise"),
               N("LayerNormalization", ["in1", "c4", "c5"], ["t6"], {"axis": -1}, family="normalization"),
               N("MatMul", ["t6", "c7"], ["t8"], family="normalization"),
               N("Add", ["t8", "c9"], ["t10"], family="normalization"),
               N("Tile", ["t8", "c11"], ["t12"], family="layout"),
               N("Relu", ["t8"], ["t13"], family="elementwise")],
        outputs=["t13", "t12", "t10", "t3"], rewrites="on", kernel_nodes=0),
}
