"""frontend/fold_bn.py: an inference BatchNormalization after a Conv folds into the Conv's weights,
and the folded model computes what onnxruntime computes for the unfolded one."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper

from opcheck import Const, graph_model, rand, run_ort
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir import interp
from tessera.tolerance import rel_l2


def _conv_bn(rng: np.random.Generator, cin: int, cout: int, groups: int, bias: bool, dtype: type,
             share: bool = False) -> tuple:
    """Conv (3x3, stride 2, pad 1) -> BatchNormalization, both on constants; odd sizes."""
    vals = {"x": rng.standard_normal((2, cin, 9, 7)).astype(dtype),
            "W": Const(rng.standard_normal((cout, cin // groups, 3, 3)).astype(dtype))}
    ins = ["x", "W"]
    if bias:
        vals["B"] = Const(rng.standard_normal(cout).astype(dtype))
        ins.append("B")
    for name, v in (("s", rng.standard_normal(cout)), ("b", rng.standard_normal(cout)),
                    ("m", rng.standard_normal(cout)), ("v", rng.random(cout) + 0.25)):
        vals[name] = Const(v.astype(dtype))
    nodes = [helper.make_node("Conv", ins, ["c"], name="conv", group=groups, strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn", epsilon=1e-3)]
    outs = ["y"]
    if share:  # the conv's own output is read too: nothing may fold
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        outs.append("r")
    return graph_model(nodes, vals, outs, opset=17), {"x": vals["x"]}


@pytest.mark.parametrize("cin,cout,groups,bias,dtype", [
    (3, 5, 1, True, np.float32), (4, 6, 2, False, np.float32), (6, 6, 6, True, np.float32),
    (5, 7, 1, False, np.float16)])
def test_folded_matches_onnxruntime(cin: int, cout: int, groups: int, bias: bool, dtype: type) -> None:
    rng = np.random.default_rng(cin * 31 + cout)
    model, feeds = _conv_bn(rng, cin, cout, groups, bias, dtype)
    loaded = load(model)
    assert [n.op for n in loaded.graph.nodes] == ["Conv"]
    assert loaded.folding.folded_nodes["BatchNormalization into Conv"] == 1
    assert set(loaded.graph.nodes[0].source) >= {"conv", "bn"}  # kernels still name both ONNX nodes
    ref = run_ort(model, feeds)[0]
    pg = fission(loaded.graph).graph
    got = interp.run(pg, feeds)[pg.outputs[0]]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert rel_l2(got, ref) < (1e-5 if dtype == np.float32 else 2e-3)


def test_conv_output_read_elsewhere_is_not_folded() -> None:
    model, feeds = _conv_bn(np.random.default_rng(1), 3, 4, 1, True, np.float32, share=True)
    loaded = load(model)
    assert sorted(n.op for n in loaded.graph.nodes) == ["BatchNormalization", "Conv", "Relu"]
    pg = fission(loaded.graph).graph
    got = interp.run(pg, feeds)
    for name, ref in zip(("y", "r"), run_ort(model, feeds)):
        assert rel_l2(got[name], ref) < 1e-5


def test_batch_norm_of_an_input_is_left_alone() -> None:
    vals = {"x": rand(2, 3, 5, 5, seed=3), **{n: Const(rand(3, seed=i, lo=0.5, hi=1.5))
                                               for i, n in enumerate("sbmv")}}
    model = graph_model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])], vals, ["y"])
    assert [n.op for n in load(model).graph.nodes] == ["BatchNormalization"]


def test_dynamo_graph_of_conv_bn_relu_folds() -> None:
    """The PyTorch frontend keeps BatchNorm as its own op; the load folds it, as the ONNX export would."""
    from tessera.frontend.fx import aten_graph, to_onnx

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                            torch.nn.ReLU()).eval()
    with torch.no_grad():  # statistics that are not the identity
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
        m[1].weight.uniform_(0.5, 1.5)
    x = torch.randn(1, 3, 11, 9)
    bridge = to_onnx(aten_graph(m, [x]), [x], set(), "conv_bn")
    loaded = load(bridge.model, checker=False)
    assert "BatchNormalization" not in {n.op for n in loaded.graph.nodes}
    pg = fission(loaded.graph).graph
    got = interp.run(pg, {pg.inputs[0]: x.numpy()})[pg.outputs[0]]
    with torch.no_grad():
        ref = m(x).numpy()
    assert rel_l2(got, ref) < 1e-5


@pytest.mark.parametrize("statistics", ["set", "default"])
def test_dynamo_bridge_and_onnx_export_give_the_same_primitives(statistics: str):
    """A ResNet-style block through the PyTorch frontend and through torch.onnx.export splits into
    the same primitives (BatchNorm folded by both; the export's Gemm reads its weight transposed,
    a transpose of a constant), and both compute what eager PyTorch does. With an untrained
    network's statistics (mean 0, shift 0) the folded bias is zeros, which the export leaves off:
    so must the frontend (the zoo's ResNet-50 through the backend had an add of zeros in every
    convolution, issue 16)."""
    import collections
    import io
    import warnings

    from tessera.frontend.fx import aten_graph, to_onnx

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(16)
            self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(16)
            self.c3, self.b3 = torch.nn.Conv2d(16, 16, 1, bias=False), torch.nn.BatchNorm2d(16)
            self.pool, self.fc = torch.nn.MaxPool2d(3, 2, 1), torch.nn.Linear(16, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pool(torch.relu(self.b1(self.c1(x))))
            y = self.b3(self.c3(torch.relu(self.b2(self.c2(x)))))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(torch.relu(x + y), 1), 1))

    torch.manual_seed(0)
    m = Block().eval()
    with torch.no_grad():
        for b in (m.b1, m.b2, m.b3) if statistics == "set" else ():
            b.running_mean.uniform_(-1, 1)
            b.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 33, 31)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the exporter the zoo and the shared models use (the TorchScript one keeps a bias of zeros)
        torch.onnx.export(m, (x,), buf, dynamo=True, optimize=True, verbose=False)
    exported = load(buf.getvalue())
    bridged = load(to_onnx(aten_graph(m, [x]), [x], set(), "block").model, checker=False)
    with torch.no_grad():
        ref = m(x).numpy()
    prims = []
    for loaded in (exported, bridged):
        assert "BatchNormalization" not in {n.op for n in loaded.graph.nodes}
        pg = fission(loaded.graph).graph
        prims.append(collections.Counter(n.op for n in pg.nodes if n.op != "transpose"))
        assert rel_l2(interp.run(pg, {pg.inputs[0]: x.numpy()})[pg.outputs[0]], ref) < 1e-5
    assert prims[0] == prims[1]
    assert prims[0]["add"] == (5 if statistics == "set" else 2)  # 3 biases, the residual, the fc's bias


def _bn_consts(rng: np.random.Generator, c: int, dtype: type = np.float32) -> dict:
    return {n: Const(v.astype(dtype)) for n, v in (("s", rng.standard_normal(c)), ("b", rng.standard_normal(c)),
                                                  ("m", rng.standard_normal(c)), ("v", rng.random(c) + 0.25))}


@pytest.mark.parametrize("op,attrs,bias_shape", [
    ("Gemm", {"transB": 1}, (7,)), ("Gemm", {"transB": 0, "alpha": 2.0, "beta": 0.5}, (1, 7)),
    ("Gemm", {"transA": 1, "transB": 1}, None), ("Gemm", {"beta": 0.25}, (5, 7)), ("MatMul", {}, None)])
def test_linear_then_batch_norm_folds(op: str, attrs: dict, bias_shape: tuple | None) -> None:
    """BatchNorm1d after a linear layer: Gemm in every transpose and scaling, or MatMul by a constant."""
    rng = np.random.default_rng(len(attrs) * 7 + (len(bias_shape) if bias_shape else 0))
    m, k, n = 5, 6, 7
    a = rng.standard_normal((k, m) if attrs.get("transA") else (m, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if attrs.get("transB") else (k, n)).astype(np.float32)
    vals = {"x": a, "W": Const(w), **_bn_consts(rng, n)}
    ins = ["x", "W"]
    if bias_shape:
        vals["C"] = Const(rng.standard_normal(bias_shape).astype(np.float32))
        ins.append("C")
    nodes = [helper.make_node(op, ins, ["y0"], name="lin", **attrs),
             helper.make_node("BatchNormalization", ["y0", "s", "b", "m", "v"], ["y"], name="bn", epsilon=1e-3)]
    model = graph_model(nodes, vals, ["y"], opset=17)
    loaded = load(model)
    assert [nd.op for nd in loaded.graph.nodes] == ["Gemm"]
    pg = fission(loaded.graph).graph
    got = interp.run(pg, {"x": a})[pg.outputs[0]]
    assert rel_l2(got, run_ort(model, {"x": a})[0]) < 1e-5


@pytest.mark.parametrize("op", ["Conv", "MatMul"])
def test_a_shift_of_zeros_adds_no_bias(op: str) -> None:
    # An untrained network's BatchNorm (mean 0, bias 0) folds into the weights alone: no bias of
    # zeros for every kernel's epilogue to add. The result still matches onnxruntime.
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 6, 5) if op == "Conv" else (4, 3)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3) if op == "Conv" else (3, 4)).astype(np.float32)
    bn = {"s": Const(rng.random(4).astype(np.float32) + 0.5), "b": Const(np.zeros(4, np.float32)),
          "m": Const(np.zeros(4, np.float32)), "v": Const(rng.random(4).astype(np.float32) + 0.25)}
    nodes = [helper.make_node(op, ["x", "W"], ["y0"], **({"pads": [1, 1, 1, 1]} if op == "Conv" else {})),
             helper.make_node("BatchNormalization", ["y0", "s", "b", "m", "v"], ["y"])]
    model = graph_model(nodes, {"x": x, "W": Const(w), **bn}, ["y"], opset=17)
    loaded = load(model)
    assert [(nd.op, len(nd.inputs)) for nd in loaded.graph.nodes] == [("Conv" if op == "Conv" else "Gemm", 2)]
    pg = fission(loaded.graph).graph
    assert "add" not in {nd.op for nd in pg.nodes}
    assert rel_l2(interp.run(pg, {"x": x})[pg.outputs[0]], run_ort(model, {"x": x})[0]) < 1e-5


def test_matmul_that_is_not_folded() -> None:
    """A MatMul of two inputs (no constant weight) keeps its BatchNormalization."""
    rng = np.random.default_rng(5)
    vals = {"x": rng.standard_normal((4, 3)).astype(np.float32), "w": rng.standard_normal((3, 6)).astype(np.float32),
            **_bn_consts(rng, 6)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y0"]),
             helper.make_node("BatchNormalization", ["y0", "s", "b", "m", "v"], ["y"])]
    loaded = load(graph_model(nodes, vals, ["y"], opset=17))
    assert sorted(nd.op for nd in loaded.graph.nodes) == ["BatchNormalization", "MatMul"]


def test_dynamo_linear_then_batchnorm1d_folds() -> None:
    from tessera.frontend.fx import aten_graph, to_onnx

    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(12, 9), torch.nn.BatchNorm1d(9), torch.nn.ReLU()).eval()
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    x = torch.randn(3, 12)
    loaded = load(to_onnx(aten_graph(m, [x]), [x], set(), "lin_bn").model, checker=False)
    assert "BatchNormalization" not in {nd.op for nd in loaded.graph.nodes}
    pg = fission(loaded.graph).graph
    with torch.no_grad():
        ref = m(x).numpy()
    assert rel_l2(interp.run(pg, {pg.inputs[0]: x.numpy()})[pg.outputs[0]], ref) < 1e-5
