"""The RotaryEmbedding fission rule (ops/rotary.py) against onnxruntime: both input layouts,
both pairings, partial rotation, caches gathered by runtime position_ids or given per token,
float16; end to end through tessera.compile; and as one generated kernel."""
from __future__ import annotations

import numpy as np
import pytest
from kernelcheck import check_kernel
from onnx import helper
from opcheck import Const, build_model, check_op, graph_model, rand, run_ort
from test_gemm_template import check_template

from tessera.codegen.kernels import GemmSchedule
from tessera.errors import TesseraError
from tessera.fission import fission
from tessera.frontend import load
from tessera.tolerance import rel_l2

B, H, S, D, MAX_POS = 2, 3, 7, 16, 32  # odd sequence, a cache longer than it


def _positions(seed: int, batch: int = B, seq: int = S, max_pos: int = MAX_POS) -> np.ndarray:
    """Random positions in [0, max_pos), both ends and a repeat included."""
    p = np.random.default_rng(seed).integers(0, max_pos, (batch, seq)).astype(np.int64)
    p[0, :3] = [0, max_pos - 1, max_pos - 1]
    return p


def _caches(rows: tuple[int, ...], half: int, seed: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin of real angles (a RoPE table), shaped rows + (half,)."""
    theta = rand(*rows, half, seed=seed, lo=-50, hi=50)
    return np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)


def _x(three_d: bool, seed: int, dtype=np.float32, seq: int = S) -> np.ndarray:
    return (rand(B, seq, H * D, seed=seed) if three_d else rand(B, H, seq, D, seed=seed)).astype(dtype)


def _attrs(three_d: bool, interleaved: int, rotary: int) -> dict:
    attrs = {"interleaved": interleaved, "rotary_embedding_dim": rotary}
    return {**attrs, "num_heads": H} if three_d else attrs


@pytest.mark.parametrize("rotary", [0, 8])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("three_d", [False, True])
def test_position_ids_as_graph_input(three_d, interleaved, rotary):
    """Computed positions: the cos/sin rows are a GATHER of the caches."""
    cos, sin = _caches((MAX_POS,), (rotary or D) // 2, seed=1)
    inputs = {"x": _x(three_d, seed=2), "cos": Const(cos), "sin": Const(sin), "pos": _positions(3)}
    check_op("RotaryEmbedding", inputs, _attrs(three_d, interleaved, rotary), opset=23,
             expect_prims=["gather", "slice", "concat", "mul", "neg", "add"])


@pytest.mark.parametrize("rotary", [0, 8])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("three_d", [False, True])
def test_caches_per_token_without_position_ids(three_d, interleaved, rotary):
    """3-D caches [B, S, rotary/2], here graph inputs, used as given: no GATHER."""
    cos, sin = _caches((B, S), (rotary or D) // 2, seed=4)
    inputs = {"x": _x(three_d, seed=5), "cos": cos, "sin": sin}
    pg = check_op("RotaryEmbedding", inputs, _attrs(three_d, interleaved, rotary), opset=23)
    assert all(n.op != "gather" for n in pg.nodes)


@pytest.mark.parametrize("with_pos", [False, True])
@pytest.mark.parametrize("interleaved", [0, 1])
def test_float16(with_pos, interleaved):
    rows = (MAX_POS,) if with_pos else (B, 5)
    cos, sin = _caches(rows, 4, seed=6, dtype=np.float16)
    inputs = {"x": _x(False, seed=7, dtype=np.float16, seq=5), "cos": Const(cos), "sin": Const(sin)}
    if with_pos:
        inputs["pos"] = _positions(8, seq=5)
    check_op("RotaryEmbedding", inputs, _attrs(False, interleaved, 8), opset=23, tol=2e-3)


def test_constant_position_ids_and_one_token():
    """Decoding one token at a time: seq 1, positions baked into the model."""
    cos, sin = _caches((MAX_POS,), D // 2, seed=9)
    inputs = {"x": rand(B, 1, H * D, seed=10), "cos": Const(cos), "sin": Const(sin),
              "pos": Const(np.array([[5], [MAX_POS - 1]], np.int64))}
    check_op("RotaryEmbedding", inputs, _attrs(True, 1, 0), opset=23)


def test_odd_rotary_dim_stays_opaque():
    """The spec cannot halve an odd rotary dim: left to the fallback, which runs it as onnxruntime does."""
    cos, sin = _caches((MAX_POS,), 3, seed=11)
    model = build_model("RotaryEmbedding", {"x": _x(False, seed=12), "cos": Const(cos), "sin": Const(sin),
                                            "pos": _positions(13)}, {"rotary_embedding_dim": 7}, opset=23)
    (op,) = fission(load(model).graph).opaque
    assert "odd rotary dim" in op.reason


@pytest.mark.parametrize("half,pos,attrs,match", [
    (4, True, {}, "caches must be"),  # the caches fit neither head_size/2 nor a rotary_embedding_dim
    (8, False, {}, "caches must be"),  # [max_pos, half] caches without position_ids
    (8, True, {"rotary_embedding_dim": 18}, "outside"),  # wider than a head
])
def test_malformed(half, pos, attrs, match):
    cos, sin = _caches((MAX_POS,), half, seed=14)
    inputs = {"x": _x(False, seed=15), "cos": Const(cos), "sin": Const(sin)}
    if pos:
        inputs["pos"] = _positions(16)
    with pytest.raises(TesseraError, match=match):
        fission(load(build_model("RotaryEmbedding", inputs, attrs, opset=23)).graph)


def test_end_to_end_between_matmul_and_add():
    """A query projection, rotated by computed positions (3-D, num_heads), plus a residual."""
    import tessera

    hidden = H * D
    cos, sin = _caches((MAX_POS,), 4, seed=17)
    inputs = {"h": rand(B, S, hidden, seed=18), "pos": _positions(19),
              "w": Const(rand(hidden, hidden, seed=20, lo=-0.3, hi=0.3)), "cos": Const(cos), "sin": Const(sin)}
    nodes = [helper.make_node("MatMul", ["h", "w"], ["q"]),
             helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["r"],
                              num_heads=H, rotary_embedding_dim=8, interleaved=1),
             helper.make_node("Add", ["r", "h"], ["y"])]
    model = graph_model(nodes, inputs, ["y"], opset=23)
    run = tessera.compile(model, tessera.CompileOptions(cost="analytical"))
    assert all(n.op != "opaque" for n in run.graph.nodes)
    feeds = {k: v for k, v in inputs.items() if not isinstance(v, Const)}
    got = run.run(**feeds)["y"].cpu().numpy()
    assert rel_l2(got, run_ort(model, feeds)[0]) < 1e-5


@pytest.mark.parametrize("interleaved", [0, 1])
def test_gather_and_rotation_in_one_kernel(interleaved):
    """Runtime positions: the GATHER of cos/sin, the rotation and the pass-through tail are one kernel."""
    cos, sin = _caches((MAX_POS,), 4, seed=21)
    inputs = {"x": _x(False, seed=22), "cos": Const(cos), "sin": Const(sin), "pos": _positions(23)}
    model = build_model("RotaryEmbedding", inputs, _attrs(False, interleaved, 8), opset=23)
    check_kernel(model, {"x": inputs["x"], "pos": inputs["pos"]})


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("three_d,rotary", [(True, 0), (True, 8), (False, 0), (False, 8)])
def test_a_projection_computes_the_rotation_in_its_template(three_d, rotary, interleaved):
    """The fission writes x * cos + rotate(x) * sin, as the Llama and GPT-J exports do, so a GEMM template
    before the op reads rotate(x) from its accumulator's registers (`codegen/rotary.py`): the projection's
    template with the whole rotation builds and matches float64, in both forms, [B, S, H * D] with
    num_heads or the heads transposed to [B, H, S, D] first, whole or partial (the 3-D form's partial
    rotation stores through a reshape after the concat that puts the rest back: `tile.store_outputs` maps
    it forward). Whether a plan takes it is the solver's choice; the compiled model matches onnxruntime
    either way."""
    import tessera
    from tessera.compiler import CompileOptions

    hidden = H * D
    cos, sin = _caches((MAX_POS,), (rotary or D) // 2, seed=31)
    inputs = {"h": rand(B, S, hidden, seed=32), "pos": _positions(33), "heads": Const(np.array([B, S, H, D])),
              "w": Const(rand(hidden, hidden, seed=34, lo=-0.3, hi=0.3)), "cos": Const(cos), "sin": Const(sin)}
    attrs = {"rotary_embedding_dim": rotary, "interleaved": interleaved}
    if three_d:
        nodes = [helper.make_node("MatMul", ["h", "w"], ["q"]),
                 helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["y"], num_heads=H, **attrs)]
    else:
        nodes = [helper.make_node("MatMul", ["h", "w"], ["p"]), helper.make_node("Reshape", ["p", "heads"], ["ph"]),
                 helper.make_node("Transpose", ["ph"], ["q"], perm=[0, 2, 1, 3]),
                 helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["y"], **attrs)]
    model = graph_model(nodes, inputs, ["y"], opset=23)
    feeds = {k: v for k, v in inputs.items() if not isinstance(v, Const)}
    ks, _ = check_template(model, feeds, GemmSchedule(16, 16, 16, 2, 2, 1, 1), "fp32")
    assert "tl.join(" in ks.source
    run = tessera.compile(model, CompileOptions(cost="analytical", templates="force"))
    assert rel_l2(run.run(**feeds)["y"].cpu().numpy(), run_ort(model, feeds)[0]) < 1e-5
