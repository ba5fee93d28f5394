"""Matmuls sharing a left operand through constant weights merge into one (rewrite/merged.py
`merge_weight_matmuls`): the same values, a step record an artifact replays, only where templates run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from opcheck import Const, graph_model, rand

from tessera.cli.main import main
from tessera.compiler import CompileOptions, compile_model
from tessera.fission import fission
from tessera.frontend import load
from tessera.ir.interp import run
from tessera.ir.prims import Prim
from tessera.rewrite.rules.base import new_graph
from tessera.rewrite.merged import merge_weight_matmuls
from tessera.rewrite.search import replay
from tessera.runtime.artifact import graph_digest
from tessera.verify import random_inputs

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def _three_projections_and_an_activation():
    """q, k, v = x @ wq, x @ wk, x @ wv (constants, odd widths) and x @ a (an input): QKV beside a
    product whose right operand is not known at compile time."""
    rng = np.random.default_rng(5)
    g, b = new_graph({"x": (7, 13), "a": (13, 5)})
    ws = [b.const(rng.standard_normal((13, n)).astype(np.float32), f"w{i}") for i, n in enumerate((11, 3, 11))]
    outs = [b.matmul("x", w) for w in ws] + [b.matmul("x", "a")]
    g.outputs = [b.unary(Prim.EXP, o) for o in outs]
    return g


def test_constant_weights_merge_into_one_matmul_with_the_same_values():
    g = _three_projections_and_an_activation()
    merged, steps = merge_weight_matmuls(g)
    assert [s["rule"] for s in steps] == ["matmuls_sharing_left"] * 2
    matmuls = [n for n in merged.nodes if n.op == Prim.MATMUL.value]
    assert sorted(merged.types[n.inputs[1]].shape for n in matmuls) == [(13, 5), (13, 25)]  # "a" stays apart
    feeds = {"x": np.random.default_rng(6).standard_normal((7, 13)), "a": np.random.default_rng(7).standard_normal((13, 5))}
    want, got = run(g, feeds, exact=True), run(merged, feeds, exact=True)
    assert all(np.allclose(want[o], got[o], rtol=1e-12, atol=0) for o in g.outputs)
    assert graph_digest(replay(g, steps)) == graph_digest(merged)  # what an artifact rebuilds
    assert merge_weight_matmuls(merged)[1] == []  # nothing is left to merge


def test_merged_only_where_templates_compete_and_not_when_turned_off(tmp_path):
    x = rand(5, 13, seed=8)
    model = graph_model([helper.make_node("MatMul", ["x", "w1"], ["y1"]), helper.make_node("MatMul", ["x", "w2"], ["y2"])],
                        {"x": x, "w1": Const(rand(13, 7, seed=9)), "w2": Const(rand(13, 3, seed=10))}, ["y1", "y2"])
    path = tmp_path / "two.onnx"
    onnx.save(model, path)

    def merges(opts: CompileOptions) -> int:
        return sum(isinstance(r, dict) for r in compile_model(path, opts).rewrites)

    assert merges(CompileOptions(cost="analytical")) == 0  # templates unmeasured: the library path
    assert merges(CompileOptions(cost="analytical", templates="force")) == 1
    assert merges(CompileOptions(cost="analytical", templates="force", merge_matmuls=False)) == 0
    out = tmp_path / "off"
    assert main(["compile", str(path), "--templates", "force", "--merge-matmuls", "off", "-o", str(out)]) == 0
    assert not any(isinstance(r, dict) for r in json.loads((out / "artifact.json").read_text())["rewrites"])


def test_bert_qkv_merges_and_the_artifact_replays(tmp_path, capsys):
    out = tmp_path / "a"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "--templates", "force", "-o", str(out),
                 "--cost", "analytical"]) == 0  # a measured compile (a GPU machine's default) names other kernels
    assert "merged: 4 pair(s) of matmuls" in capsys.readouterr().out
    meta = json.loads((out / "artifact.json").read_text())
    merges = [r for r in meta["rewrites"] if isinstance(r, dict)]
    assert [r["rule"] for r in merges] == ["matmuls_sharing_left"] * 4  # q, k, v of two layers: two steps each
    assert meta["rewrites"][-1] == "deferred_normalization"
    plan = json.loads((out / "plan.json").read_text())
    # one QKV product per layer: 2 layers x (QKV, two in attention, the output projection, two in the MLP)
    assert sum(p.rsplit("/", 1)[-1].startswith("matmul") for k in plan["kernels"] for p in k["prims"]) == 12
    assert main(["run", str(out), "--check"]) == 0  # loads by replaying the merges, then checks


@pytest.mark.parametrize("name,merges", [("bert_tiny", 4), ("segformer_b0_small", 10)])
def test_shared_models_compute_the_same_after_their_merges(name, merges):
    # BERT's Q, K and V; SegFormer's K and V (read from the reduced sequence): the merged graph
    # gives the unmerged one's outputs in the float64 interpreter, on fresh random inputs.
    g = fission(load(MODELS / f"{name}.onnx").graph).graph
    merged, steps = merge_weight_matmuls(g)
    assert len(steps) == merges
    feeds = random_inputs(g, seed=11)
    want, got = run(g, feeds, exact=True), run(merged, feeds, exact=True)
    assert all(np.allclose(got[o], want[o], rtol=1e-12, atol=0) for o in g.outputs)
