"""The PyTorch frontend and backend (issue 16): nn.Module and dynamo graphs against eager, on fresh
random inputs, through Triton's interpreter. Each model's plan is the analytical one."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import transformers
from torch import nn

import tessera
from tessera.compiler import write_artifacts
from tessera.errors import TesseraError
from tessera.ir import aten_call
from tessera.tolerance import TOLERANCE, rel_l2
from tessera.torch_backend import CompiledModule, tessera_backend
from tessera.torch_dynamic import BucketedModule

CPU = {"cost": "analytical"}


@pytest.fixture(autouse=True, scope="module")
def _fresh_dynamo(tmp_path_factory: pytest.TempPathFactory):
    """Dynamo's caches and counters are per process: leave none to the other test files. Plans are
    cached under a fresh TESSERA_CACHE, so no test finds one an earlier run left."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()
    torch._dynamo.reset()


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = rel_l2(got.detach().double().numpy(), want.detach().double().numpy())
    assert err < TOLERANCE["fp32"], err


class Recorder:
    """A backend that compiles with tessera and keeps what each captured graph became."""

    def __init__(self) -> None:
        self.compiled: list[Any] = []  # CompiledModule, or BucketedModule for a dynamic graph

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list, **kw: object) -> Any:
        c = tessera_backend(gm, example_inputs, options=CPU)
        self.compiled.append(c)
        return c


def test_module_compiles_directly_against_eager() -> None:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 33), nn.GELU(), nn.Linear(33, 7), nn.Tanh()).eval()
    x = torch.randn(5, 16)
    c = tessera.compile(mlp, (x,))
    assert isinstance(c, CompiledModule) and not c.bridge.opaque
    assert {n.op_type for n in c.bridge.model.graph.node} >= {"Gemm", "Gelu", "Tanh"}  # 2-D: as exported
    fresh = torch.randn(5, 16)
    with torch.no_grad():
        close(c(fresh), mlp(fresh))


class _AttentionBlock(nn.Module):
    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


def test_linear_and_attention_products_bridge_as_the_onnx_export_writes_them() -> None:
    # A linear layer on a 3-D input is one MatMul by the transposed weight and an Add, and SDPA's
    # products are 4-D MatMuls: no flattening views and no addmm/bmm, so fission gives the ONNX
    # path's primitives and the two plans share kernel signatures (issue 16).
    torch.manual_seed(3)
    block = _AttentionBlock().eval()
    x = torch.randn(1, 7, 32)
    c = tessera.compile(block, (x,))
    g = c.bridge.model.graph
    assert not c.bridge.opaque and not any(n.op_type == "Gemm" for n in g.node)
    ranks = {i.name: len(i.dims) for i in g.initializer}
    inferred = onnx.shape_inference.infer_shapes(c.bridge.model).graph
    ranks.update({v.name: len(v.type.tensor_type.shape.dim) for v in [*inferred.value_info, *inferred.input]})
    products = sorted((ranks[n.input[0]], ranks[n.input[1]]) for n in g.node if n.op_type == "MatMul")
    assert products == [(3, 2), (3, 2), (4, 4), (4, 4)]  # qkv and out projections, then QK^T and PV
    fresh = torch.randn(1, 7, 32)
    with torch.no_grad():
        close(c(fresh), block(fresh))


def test_a_zero_bias_of_addmm_is_dropped_as_the_export_drops_it() -> None:
    # transformers initializes biases to zero. The ONNX export writes GPT-2's Conv1D (addmm) with a
    # zero bias as a Gemm without C, and so does the bridge (frozen weights); F.linear keeps its Add,
    # as the export keeps it.
    torch.manual_seed(4)

    class Conv1D(nn.Module):  # GPT-2's linear layer: addmm on the flattened input
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.randn(16, 8)), nn.Parameter(torch.zeros(8))

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.addmm(self.bias, h.view(-1, 16), self.weight).view(*h.shape[:-1], 8)

    m, h = Conv1D().eval(), torch.randn(2, 5, 16)
    c = tessera.compile(m, (h,))
    gemms = [n for n in c.bridge.model.graph.node if n.op_type == "Gemm"]
    assert len(gemms) == 1 and len(gemms[0].input) == 2
    with torch.no_grad():
        close(c(h), m(h))
    lin = nn.Linear(16, 8).eval()
    with torch.no_grad():
        lin.bias.zero_()
    c = tessera.compile(lin, (h,))
    assert [n.op_type for n in c.bridge.model.graph.node] == ["MatMul", "Add"]
    with torch.no_grad():
        close(c(h), lin(h))


def test_backend_by_name_conv_batchnorm_relu() -> None:
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 6, 3, stride=2, groups=2), nn.BatchNorm2d(6), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 5)).eval()
    with torch.no_grad():  # statistics that are not the identity
        for bn in (net[1], net[5]):
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
    f = torch.compile(net, backend="tessera", options=CPU)  # the entry point, no import
    with torch.no_grad():
        for _ in range(2):  # the second call reuses the plan
            x = torch.randn(2, 3, 17, 17)
            close(f(x), net(x))


def test_training_mode_is_refused() -> None:
    with pytest.raises(TesseraError, match="training mode"):
        tessera.compile(nn.Linear(3, 3), (torch.randn(1, 3),))


def test_unknown_option_is_named() -> None:
    with pytest.raises(TesseraError, match="precison"):
        tessera.compile(nn.Linear(3, 3).eval(), {"precison": "fp16"}, example_inputs=(torch.randn(1, 3),))


class Broken(nn.Module):
    """A graph break between two graphs, and an op tessera has no converter for (sin)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        torch._dynamo.graph_break()
        return self.b(torch.atan(h)).softmax(-1)


def test_graph_break_and_an_opaque_aten_op() -> None:
    torch.manual_seed(2)
    m = Broken().eval()
    rec = Recorder()
    f = torch.compile(m, backend=rec)
    with torch.no_grad():
        x = torch.randn(3, 8)
        close(f(x), m(x))
    assert len(rec.compiled) == 2
    assert [c.bridge.opaque for c in rec.compiled] == [[], ["aten.atan.default"]]
    cum = [n for n in rec.compiled[1].bridge.model.graph.node if n.domain == aten_call.ATEN_DOMAIN]
    assert [n.op_type for n in cum] == ["aten.atan.default"]


class Spectrum(nn.Module):
    """FNet's token mixing: the real part of a 2-D FFT, complex tensors in between."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fftn(self.a(x), dim=(-2, -1)).real


def test_a_graph_tessera_cannot_represent_runs_in_pytorch_with_a_warning(caplog) -> None:
    """Complex tensors have no tessera dtype: the graph runs as dynamo captured it, the call
    succeeds, and a warning names the graph and the reason (the backend used to fail the whole
    torch.compile with BackendCompilerFailed; found on FNet, session 50)."""
    import logging

    torch._dynamo.reset()
    torch.manual_seed(3)
    m = Spectrum().eval()
    f = torch.compile(m, backend=tessera_backend)
    x = torch.randn(2, 5, 8)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tessera"):
        close(f(x), m(x))
    msgs = [r.getMessage() for r in caplog.records]
    assert any("runs in PyTorch, not tessera: tensors of torch.complex64 are not supported" in t for t in msgs), msgs


def test_cumsum_bridges_to_onnx_cumsum() -> None:
    """torch.cumsum (float, and int64 of a bool mask as position ids are made) lowers through ONNX
    CumSum's rule rather than staying an ATen call."""
    torch.manual_seed(4)
    lin = nn.Linear(8, 8).eval()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cumsum(lin(x), 1), torch.cumsum((x > 0).long(), dim=-1) * 2

    x = torch.randn(3, 8)
    c = tessera.compile(fn, {"cost": "analytical", "plan_cache": False}, example_inputs=(x,))
    assert c.bridge.opaque == []
    fresh = torch.randn(3, 8)
    with torch.no_grad():
        got, want = c(fresh), fn(fresh)
    close(got[0], want[0])
    assert torch.equal(got[1], want[1])


def test_trigonometry_rounding_and_remainders_bridge() -> None:
    """A rotary table's sin and cos, rounding, and remainders lower through their ONNX rules; only a float
    remainder (Python's, which ONNX Mod lacks for floats) stays an ATen call."""
    torch.manual_seed(5)
    lin = nn.Linear(8, 8).eval()

    def fn(x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = lin(x) * 40
        return (torch.sin(h) + torch.cos(h) * torch.tan(x), torch.floor(h) + torch.ceil(h) - torch.round(h),
                torch.fmod(h, 3.0), torch.remainder(i, -3), torch.fmod(i, 4), torch.remainder(h, 2.5))

    x, i = torch.randn(3, 8), torch.randint(-20, 20, (3, 8))
    c = tessera.compile(fn, {"cost": "analytical", "plan_cache": False}, example_inputs=(x, i))
    assert c.bridge.opaque == ["aten.remainder.Scalar"]
    fresh, fi = torch.randn(3, 8), torch.randint(-20, 20, (3, 8))
    with torch.no_grad():
        got, want = c(fresh, fi), fn(fresh, fi)
    for g, w in zip(got[:3], want[:3]):
        close(g, w)
    assert torch.equal(got[3], want[3]) and torch.equal(got[4], want[4])
    close(got[5], want[5])


def test_topk_bridges_to_onnx_topk() -> None:
    """A mixture-of-experts router: softmax, then the top 2 experts' weights and indices (largest) and
    the 3 smallest along another axis, lowered through ONNX TopK's rule, not left an ATen call."""
    torch.manual_seed(6)
    lin = nn.Linear(8, 6).eval()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = torch.softmax(lin(x), -1)
        w, i = torch.topk(p, 2)
        v, j = torch.topk(p, 3, dim=0, largest=False)
        return w / w.sum(-1, keepdim=True), i, v, j

    x = torch.randn(5, 8)
    c = tessera.compile(fn, {"cost": "analytical", "plan_cache": False}, example_inputs=(x,))
    assert c.bridge.opaque == []
    fresh = torch.randn(5, 8)
    with torch.no_grad():
        got, want = c(fresh), fn(fresh)
    close(got[0], want[0])
    close(got[2], want[2])
    assert torch.equal(got[1], want[1]) and torch.equal(got[3], want[3])


def test_artifact_of_a_module_with_an_aten_call(tmp_path: Path) -> None:
    """Saved and loaded like any artifact; `run --check`'s reference runs the ATen call in torch."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.atan(m(x)).exp()

    x = torch.randn(3, 8)
    c = tessera.compile(fn, {"cost": "analytical", "plan_cache": False}, example_inputs=(x,))
    write_artifacts(c.result, tmp_path / "art")
    loaded = tessera.load(tmp_path / "art")
    fresh = torch.randn(3, 8)
    with torch.no_grad():
        close(loaded(fresh)[0], fn(fresh))
    from tessera.verify import random_inputs, run_onnxruntime
    feeds = random_inputs(loaded.graph, 7)
    ref = run_onnxruntime(c.bridge.model, feeds)
    with torch.no_grad():
        want = fn(torch.from_numpy(feeds[loaded.graph.inputs[0]]))
    close(torch.from_numpy(next(iter(ref.values()))), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_bridge_writes_models_the_onnx_checker_accepts(dtype: torch.dtype) -> None:
    """compile_module loads the bridge's models without onnx's checker (it serializes the weights
    again), so the checker must accept what the bridge writes, and its initializers must hold the
    module's values bit for bit (bfloat16 as raw bits; a weight may be stored transposed, folded)."""
    from onnx import numpy_helper

    from tessera.frontend.fx import aten_graph, to_onnx
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(6, 7), nn.GELU(), nn.Linear(7, 3)).eval().to(dtype)
    x = torch.randn(5, 6, dtype=dtype)
    bridge = to_onnx(aten_graph(m, [x]), [x], set(), "mlp")
    onnx.checker.check_model(bridge.model, full_check=True)
    inits = {t.name: t for t in bridge.model.graph.initializer}
    found = 0
    for p_ in m.parameters():
        want = p_.detach().float().numpy()
        for t in inits.values():
            got = numpy_helper.to_array(t)
            got = got.view(np.uint16).astype(np.uint32) if t.data_type == onnx.TensorProto.BFLOAT16 else got
            if t.data_type == onnx.TensorProto.BFLOAT16:
                got = (got << 16).view(np.float32)
            if any(got.shape == w.shape and np.array_equal(got.astype(np.float32), w) for w in (want, want.T)):
                found += 1
                break
    assert found == len(list(m.parameters()))


def test_plan_key_follows_the_weights_not_the_graph_name() -> None:
    """The plan cache's key hashes the model in place (no serialization of the weights): the same
    model under another graph name (dynamo numbers its graphs) hits, another weight misses."""
    from tessera.frontend.fx import aten_graph, to_onnx
    from tessera.runtime.plan_cache import model_digest
    m = nn.Sequential(nn.Linear(6, 7), nn.ReLU()).eval()
    x = torch.randn(2, 6)
    a = to_onnx(aten_graph(m, [x]), [x], set(), "graph_0").model
    b = to_onnx(aten_graph(m, [x]), [x], set(), "graph_1").model
    assert model_digest(a) == model_digest(b)
    with torch.no_grad():
        m[0].weight[3, 2] += 1e-3
    c = to_onnx(aten_graph(m, [x]), [x], set(), "graph_0").model
    assert model_digest(c) != model_digest(a)


def test_aten_call_arguments_round_trip() -> None:
    """dtypes, infinities, lists and devices survive the JSON; tensors come back by position."""
    x = torch.randn(2, 3)
    call = aten_call.dumps([None, [1, 2], -math.inf], {"dtype": torch.float16, "device": torch.device("cpu")},
                           lambda v: None)
    spec = json.loads(call)
    assert spec["kwargs"]["dtype"] == {"dtype": "float16"} and spec["args"][2] == {"float": "-inf"}
    out = aten_call.run("aten.clamp.default", aten_call.dumps([x, -math.inf, 0.5], {}, lambda v: 0 if v is x else None),
                        [x])
    assert torch.equal(out[0], x.clamp(max=0.5))
    with pytest.raises(Exception, match="not an ATen"):
        aten_call.overload("os.system.default")


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(torch.relu(self.b1(self.c1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """timm's and torchvision's resnet18 layer for layer (timm needs torchvision, whose wheels for
    this torch are CUDA builds that do not load beside the CPU torch: the GPU runs use timm's)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, c in enumerate([64, 128, 256, 512]):
            blocks += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def test_resnet18_at_64() -> None:
    torch.manual_seed(4)
    m = ResNet18().eval()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    f = torch.compile(m, backend="tessera", options=CPU)
    with torch.no_grad():
        x = torch.randn(1, 3, 64, 64)
        close(f(x), m(x))


def test_transformers_bert_two_layers_with_padding() -> None:
    torch.manual_seed(5)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=100)
    m = transformers.BertModel(cfg).eval()
    rec = Recorder()
    f = torch.compile(m, backend=rec)
    ids = torch.randint(0, 100, (2, 13))
    mask = torch.ones(2, 13, dtype=torch.long)
    mask[1, 9:] = 0  # the second sequence padded: the additive mask matters
    with torch.no_grad():
        close(f(input_ids=ids, attention_mask=mask).last_hidden_state,
              m(input_ids=ids, attention_mask=mask).last_hidden_state)
    assert rec.compiled and all(not c.bridge.opaque for c in rec.compiled)


def test_transformers_gpt2_directly() -> None:
    """tessera.compile on a module that does not trace as one graph goes through dynamo."""
    torch.manual_seed(6)
    m = transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                                       bos_token_id=0, eos_token_id=0)).eval()
    ids = torch.randint(0, 100, (1, 11))
    c = tessera.compile(m, (ids,))
    fresh = torch.randint(0, 100, (1, 11))
    with torch.no_grad():
        close(c(fresh).last_hidden_state, m(fresh).last_hidden_state)


def test_sdpa_decomposes_into_primitives() -> None:
    """F.scaled_dot_product_attention is traced in its math form (a GPU would pick cuDNN's or flash's
    kernel, one opaque call): matmuls and a softmax that chains can fuse."""
    torch.manual_seed(7)

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(1, 2, 7, 16) for _ in range(3))
    c = tessera.compile(attn, (q, k, v))
    assert not c.bridge.opaque
    assert {"MatMul", "Softmax"} <= {n.op_type for n in c.bridge.model.graph.node}
    with torch.no_grad():
        close(c(q, k, v), attn(q, k, v))


@pytest.mark.parametrize("scale", [0.5, -0.3])
def test_sdpa_with_an_explicit_scale(scale: float) -> None:
    """The scale's square root goes on q and on k's transpose, as the export writes it; a negative
    scale has no real root and goes on q alone."""
    torch.manual_seed(6)

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    c = tessera.compile(attn, (q, k, v))
    with torch.no_grad():
        close(c(q, k, v), attn(q, k, v))


@pytest.mark.parametrize("kind", ["causal", "bool", "additive", "gqa"])
def test_sdpa_forms_in_half_keep_their_dtype(kind: str) -> None:
    """Every SDPA form traces to products in the inputs' dtype (no float32 casts to stop a chain),
    and a boolean mask that hides a whole row gives zeros there, as torch does."""
    torch.manual_seed(8)
    q = torch.randn(1, 4, 6, 8)
    k, v = (torch.randn(1, 2 if kind == "gqa" else 4, 9, 8) for _ in range(2))
    mask = {"bool": torch.rand(6, 9) > 0.5, "additive": torch.randn(1, 1, 6, 9)}.get(kind)
    if kind == "bool":
        mask[2] = False  # one query sees no key

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = mask.to(q.dtype) if kind == "additive" else mask  # torch takes a float mask in q's dtype
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=kind == "causal",
                                                                enable_gqa=kind == "gqa")

    c = tessera.compile(attn, (q, k, v))
    assert not c.bridge.opaque
    with torch.no_grad():
        close(c(q, k, v), attn(q, k, v))
    half = tessera.compile(attn, {"cost": "analytical", "precision": "fp16"},
                           example_inputs=(q.half(), k.half(), v.half()))
    assert not any(n.op_type == "Cast" for n in half.bridge.model.graph.node)


def test_plan_cache_reuses_a_plan_and_drops_a_damaged_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path))
    torch.manual_seed(9)
    m = nn.Sequential(nn.Linear(12, 20), nn.SiLU(), nn.Linear(20, 3)).eval()
    x = torch.randn(4, 12)
    first = tessera.compile(m, (x,))
    assert first.result is not None
    again = tessera.compile(m, (x,))
    assert again.result is None  # from $TESSERA_CACHE/plans: nothing planned
    assert again.exe.plan["kernels"] == first.exe.plan["kernels"]
    from tessera.torch_backend import compile_module
    renamed = compile_module(m, (x,), name="renamed")  # the key leaves the label out; the plan keeps its own
    assert renamed.result is None and renamed.exe.plan["model"] == "renamed"
    fresh = torch.randn(4, 12)
    with torch.no_grad():
        close(again(fresh), m(fresh))
    from tessera.runtime.plan_cache import plan_dir
    (entry,) = plan_dir().glob("*.json")
    entry.write_text('{"plan": {"kernels": []}, "meta": {}}')  # damaged: recompiled, not trusted
    third = tessera.compile(m, (x,))
    assert third.result is not None
    with torch.no_grad():
        close(third(fresh), m(fresh))
    with torch.no_grad():
        m[0].weight.mul_(2)  # other weights: another key
    other = tessera.compile(m, (x,))
    assert other.result is not None
    with torch.no_grad():
        close(other(fresh), m(fresh))


def test_a_graph_dynamo_makes_dynamic_runs_in_buckets() -> None:
    """dynamo re-captures a graph with a dynamic batch at its second shape (automatic dynamic); the
    graph then runs one plan per power-of-two bucket, each compiled at its first call, after a
    check that zero padding leaves the real rows unchanged; a size inside a bucket reuses its plan."""
    torch._dynamo.reset()  # Sequential.forward's code was captured above: start from no history
    torch.manual_seed(10)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    rec = Recorder()
    f = torch.compile(m, backend=rec)
    with torch.no_grad():
        for b in (2, 3, 5, 3, 8, 7, 4):
            x = torch.randn(b, 8)
            out = f(x)
            assert out.shape == (b, 4)
            close(out, m(x))
    static, dynamic = rec.compiled
    assert isinstance(static, CompiledModule)
    assert isinstance(dynamic, BucketedModule)
    assert sorted(dynamic.plans) == [(4,), (8,)]  # 3 and 4 in one, 5, 7 and 8 in the other
    (dim,) = dynamic.dims
    assert dim.pad and dynamic.output_axes == {0: [(0, dim.symbol)]}


def test_mark_dynamic_bounds_the_buckets() -> None:
    """mark_dynamic(x, 0, min=2, max=6): powers of two, the last capped at the declared 6."""
    torch._dynamo.reset()
    torch.manual_seed(13)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    rec = Recorder()
    f = torch.compile(m, backend=rec)
    with torch.no_grad():
        for b in (3, 5, 6, 2):
            x = torch.randn(b, 8)
            torch._dynamo.mark_dynamic(x, 0, min=2, max=6)
            close(f(x), m(x))
    (bucketed,) = rec.compiled
    assert bucketed.dims[0].high == 6 and sorted(bucketed.plans) == [(2,), (4,), (6,)]


def _tiny(kind: str) -> nn.Module:
    torch.manual_seed(11)
    if kind == "gpt2":
        return transformers.GPT2Model(transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100,
                                                              bos_token_id=0, eos_token_id=0, use_cache=False)).eval()
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                  vocab_size=100)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


@pytest.mark.parametrize("dynamic", [None, True])
def test_gpt2_sequence_lengths_share_a_bucket(dynamic: bool | None) -> None:
    """GPT-2 at lengths 8, 13, 16, 13: with automatic dynamic the first length gets a static plan,
    with dynamic=True a bucket; 13 and 16 share the bucket of 16, padded after a check that the
    causal mask keeps the padding out of the real positions. dynamic=True also lifts module
    floats (eps, dropout p) into tensors, which each plan folds in."""
    torch._dynamo.reset()
    m = _tiny("gpt2")
    rec = Recorder()
    f = torch.compile(m, backend=rec, dynamic=dynamic)
    with torch.no_grad():
        for n in (8, 13, 16, 13):
            ids = torch.randint(0, 100, (1, n))
            close(f(input_ids=ids).last_hidden_state, m(input_ids=ids).last_hidden_state)
    bucketed = rec.compiled[-1]
    assert isinstance(bucketed, BucketedModule) and bucketed.dims[0].pad
    assert sorted(k[0] for k in bucketed.plans) == ([8, 16] if dynamic else [16])
    # the sizes and module scalars dynamo passes are folded into each plan: the ids are its one input
    assert all(plan.exe.graph.inputs == ["input_0"] for plan in bucketed.plans.values())


@pytest.mark.parametrize("mask", [False, True])
def test_bert_pads_only_with_an_attention_mask(mask: bool) -> None:
    """Without a mask BERT attends to every position, so padding would change the real ones: the
    check refuses it and each length gets its own plan. With the mask as an input, padded with
    zeros, the padding is masked out and 13 runs in the bucket of 16."""
    torch._dynamo.reset()
    m = _tiny("bert")
    rec = Recorder()
    f = torch.compile(m, backend=rec)
    with torch.no_grad():
        for n in (8, 13, 16):
            ids = torch.randint(0, 100, (1, n))
            kw = {"attention_mask": torch.ones(1, n, dtype=torch.long)} if mask else {}
            close(f(input_ids=ids, **kw).last_hidden_state, m(input_ids=ids, **kw).last_hidden_state)
    bucketed = rec.compiled[-1]
    assert isinstance(bucketed, BucketedModule)
    assert bucketed.dims[0].pad is mask
    assert sorted(k[0] for k in bucketed.plans) == ([16] if mask else [13, 16])


def test_compile_a_module_for_a_range_of_batches() -> None:
    """tessera.compile(module, dynamic=...) compiles every bucket up front: batches 1, 3 and 8 then
    run with no further compile, 3 padded into the bucket of 4."""
    torch.manual_seed(12)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                      nn.Linear(8 * 6 * 6, 5)).eval()
    with torch.no_grad():
        m[1].running_mean.normal_()
        m[1].running_var.uniform_(0.5, 2.0)
    c = tessera.compile(m, CPU, example_inputs=(torch.randn(2, 3, 6, 6),), dynamic={0: {0: (1, 8)}})
    assert isinstance(c, BucketedModule)
    assert sorted(c.plans) == [(1,), (2,), (4,), (8,)]
    with torch.no_grad():
        for b in (1, 3, 8):
            x = torch.randn(b, 3, 6, 6)
            y = c(x)
            assert y.shape == (b, 5)
            close(y, m(x))
    assert len(c.plans) == 4
    with pytest.raises(TesseraError, match="argument 0 axis 0 .* is 9"):
        c(torch.randn(9, 3, 6, 6))
    with pytest.raises(TesseraError, match="dynamic names argument 1"):
        tessera.compile(m, CPU, example_inputs=(torch.randn(2, 3, 6, 6),), dynamic={1: {0: (1, 8)}})
