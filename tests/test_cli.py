"""The `tessera` command: inspect and verify, text and JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.cli.main import main

MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"


def test_inspect_json(capsys):
    assert main(["inspect", str(MODELS / "candy_small_legacy.onnx"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["operators"]["counts"]["Conv"] == 16
    assert s["primitives"]["by_category"]["linear"] == 16
    assert s["primitives"]["by_category"]["opaque"] == 0 and s["opaque"] == []
    assert s["folding"]["folded_nodes"]["ConstantOfShape"] == 16 and s["folding"]["folded_total"] > 100
    assert s["inputs"] == [{"name": "input.1", "type": "float32[1x3x64x64]"}]


def test_inspect_text(capsys):
    assert main(["inspect", str(MODELS / "attn_s7.onnx")]) == 0
    out = capsys.readouterr().out
    for word in ("operators (5)", "primitives", "reduce_max", "opaque (0)", "folded constants"):
        assert word in out


def test_verify_exit_codes(capsys):
    assert main(["verify", str(MODELS / "gemm_g3.onnx"), "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "seed 7" in out and out.strip().endswith("PASS")
    assert main(["verify", str(MODELS / "gemm_g3.onnx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


def test_console_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "tessera", "verify", str(MODELS / "attn_s4.onnx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "PASS" in r.stdout


def test_tessera_solver_names_the_default_solver(tmp_path):
    # read when tessera is imported, so each case is a process of its own
    def compile_with(solver: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tessera", "compile", str(MODELS / "gemm_g1.onnx"), "-o",
                               str(tmp_path / solver)], env={**os.environ, "TESSERA_SOLVER": solver},
                              capture_output=True, text=True, timeout=300)

    r = compile_with("highs")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "highs" / "plan.json").read_text())
    assert {sg["solver"]["solver"] for sg in plan["subgraphs"]} == {"highs"}
    r = compile_with("nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not 'nope' (the default, from TESSERA_SOLVER)" in r.stderr


def test_compile_prints_the_greedy_baseline_within_the_cuts_and_over_the_whole_graph(tmp_path, capsys):
    # A partition cut forbids the fusions across it: the optimal plan is set beside the greedy plan of
    # the same subgraphs (what the binary program improves on) and the whole-graph greedy (what the
    # cuts may cost), each ratio from plan.json's numbers.
    out = tmp_path / "cut"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out), "--max-states", "200",
                 "--cost", "analytical"]) == 0
    text = capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    est, whole = plan["estimated_total_s"], plan["greedy_total_s"]
    within = sum(s["greedy_s"] for s in plan["subgraphs"])
    assert plan["cuts"] and est <= within
    assert (f"greedy baseline {within * 1e6:.1f} us in the same subgraphs ({within / est:.2f}x), "
            f"{whole * 1e6:.1f} us ({whole / est:.2f}x) over the whole graph, without the {len(plan['cuts'])} cut(s)") \
        in text
    assert f"<th>greedy in the same subgraphs (µs)</th><td>{within * 1e6:.2f}</td>" in (out / "report.html").read_text()


def test_compile_writes_plan_and_report(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out), "--gpu", "h200"]) == 0
    text = capsys.readouterr().out
    assert "kernels from" in text and "proven optimality" in text and "tessera run" in text
    plan = json.loads((out / "plan.json").read_text())
    assert plan["strategy"] == "optimal" and plan["device"].startswith("NVIDIA H200")
    assert plan["estimated_total_s"] <= plan["greedy_total_s"]
    for key in ("kernels", "buffers", "subgraphs", "cuts", "timings_s"):
        assert key in plan
    k = plan["kernels"][0]
    for key in ("prims", "inputs", "outputs", "cost_s", "source_nodes"):
        assert key in k
    assert all(s["solver"]["optimal"] for s in plan["subgraphs"])
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_the_default_preset_is_the_visible_gpus(tmp_path, monkeypatch):
    # --gpu auto (the default) takes the preset of the GPU CUDA names, h100 where none is visible or
    # the family has none: an H200 was priced with the H100's bandwidth (session 42), and a V100 would
    # have had chain schedules pruned for an H100's 227 KB of shared memory.
    import torch

    from tessera.compiler import preset_device
    from tessera.cost.devices import DEVICES, resolve_preset

    assert resolve_preset("auto", None) == ("h100", "no GPU visible")
    assert resolve_preset("auto", "NVIDIA H200")[0] == "h200"
    assert resolve_preset("auto", "Tesla V100-SXM2-32GB")[0] == "v100"
    assert resolve_preset("auto", "NVIDIA A100-SXM4-80GB")[0] == "a100"
    assert resolve_preset("auto", "NVIDIA L4") == ("h100", "no preset for NVIDIA L4")
    assert resolve_preset("a100", "NVIDIA H200") == ("a100", "chosen")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "Tesla V100-SXM2-32GB")
    assert preset_device("auto") is DEVICES["v100"] and preset_device("h200") is DEVICES["h200"]
    out = tmp_path / "out"
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(out), "--cost", "analytical"]) == 0
    assert json.loads((out / "plan.json").read_text())["device"] == DEVICES["v100"].name


def test_compile_bad_gpu_is_a_user_error(tmp_path, capsys):
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(tmp_path), "--strategy", "greedy",
                 "--gpu", "h100", "--cost", "analytical", "--precision", "fp16"]) == 0
    capsys.readouterr()
    assert main(["compile", str(MODELS / "nope.onnx"), "-o", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_version_and_help_defaults(capsys):
    from tessera.version import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and f"tessera {__version__}" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = capsys.readouterr().out
    assert "(default: auto)" in text and "(default: 60.0)" in text


def test_verbose_logs_the_passes_to_stderr(tmp_path, capsys, monkeypatch):
    import logging

    models = Path(__file__).resolve().parents[2] / "shared" / "models"
    monkeypatch.delenv("TESSERA_LOG", raising=False)
    assert main(["compile", str(models / "attn_s7.onnx"), "-o", str(tmp_path / "a"), "--cost", "analytical"]) == 0
    assert "pass orchestrate" not in capsys.readouterr().err  # quiet by default
    try:
        assert main(["-v", "compile", str(models / "attn_s7.onnx"), "-o", str(tmp_path / "b"), "--cost",
                     "analytical"]) == 0
        err = capsys.readouterr().err
        assert all(f"pass {p}" in err for p in ("load", "fission", "layout", "orchestrate", "codegen"))
        assert "orchestrate: 3 kernels" in err  # K^T rides in the first matmul as a transposed view
    finally:
        logging.getLogger("tessera").setLevel(logging.WARNING)


class _RecordingBar:
    """Stands in for tqdm: records every total a bar is given and every count it reaches."""
    made: list["_RecordingBar"] = []

    def __init__(self, total=None, **kwargs):
        self.totals = [total]
        self.n = 0
        self.closed = False
        _RecordingBar.made.append(self)

    def __setattr__(self, name, value):
        if name == "total":
            self.totals.append(value)
        object.__setattr__(self, name, value)

    def update(self, k=1):
        assert not self.closed
        self.n += k

    def refresh(self):
        pass

    def close(self):
        self.closed = True


def test_compile_progress_total_is_known_before_it_starts(tmp_path, monkeypatch, capsys):
    """The orchestration bar counts primitives, a total fixed once the graph is partitioned, even
    when subgraphs with too many candidates are split while solving (forced here)."""
    cli = sys.modules["tessera.cli.main"]  # the module (tessera.cli.main is also the name of its function)
    from tessera.orchestrate import orchestrator
    from tessera.orchestrate.candidates import TooManyCandidates

    real = orchestrator.enumerate_candidates

    def small_only(og, members, *args, **kwargs):
        if members.bit_count() > 3:
            raise TooManyCandidates("forced by the test")
        return real(og, members, *args, **kwargs)

    _RecordingBar.made = []
    monkeypatch.setattr(cli, "tqdm", _RecordingBar)
    monkeypatch.setattr(orchestrator, "enumerate_candidates", small_only)
    assert main(["compile", str(MODELS / "attn_s7.onnx"), "-o", str(tmp_path / "a"), "--cost", "analytical"]) == 0
    capsys.readouterr()
    plan = json.loads((tmp_path / "a" / "plan.json").read_text())
    assert len(plan["subgraphs"]) >= 3  # split while solving
    (bar,) = _RecordingBar.made  # analytical cost: no tuning bar
    assert bar.totals == [plan["orchestrated_nodes"]]  # given once, at the start, never changed
    assert bar.n == plan["orchestrated_nodes"] and bar.closed


def test_progress_bar_per_batch_keeps_its_total(monkeypatch):
    cli = sys.modules["tessera.cli.main"]  # the module (tessera.cli.main is also the name of its function)

    _RecordingBar.made = []
    monkeypatch.setattr(cli, "tqdm", _RecordingBar)
    with cli._Bar("tune", "kernel", quiet=True) as progress:
        for total in (5, 3, 3, 1, 1):  # batches of measurements, as tune() reports them
            for done in range(1, total + 1):
                progress(done, total)
    assert [b.totals for b in _RecordingBar.made] == [[5], [3], [3], [1], [1]]
    assert all(b.n == b.totals[0] and b.closed for b in _RecordingBar.made)


def test_compile_templates_flag_runs_matmuls_as_templates(tmp_path, capsys):
    # analytical cost throughout: a measured compile (a GPU machine's default) picks by its timings
    out = tmp_path / "g1"
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(out), "--templates", "force",
                 "--chains", "off", "--cost", "analytical"]) == 0
    assert "2 matmul kernel(s) run as GEMM templates" in capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert [k["schedule"]["form"] for k in plan["kernels"]] == ["gemm", "gemm"]
    assert main(["run", str(out), "--check", "--seed", "3"]) == 0
    # With chains (the default), the two matmuls are one GEMM-chain kernel, its search in plan.json.
    chain = tmp_path / "chain"
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(chain), "--templates", "force",
                 "--cost", "analytical"]) == 0
    assert "1 GEMM chain(s) run as one kernel each" in capsys.readouterr().out
    (k,) = json.loads((chain / "plan.json").read_text())["kernels"]
    assert k["schedule"]["form"] == "chain" and k["chain_search"]["after_pruning"] <= k["chain_search"]["space"]
    assert main(["run", str(chain), "--check", "--seed", "3"]) == 0
    assert main(["compile", str(MODELS / "gemm_g1.onnx"), "-o", str(tmp_path / "lib"), "--cost", "analytical"]) == 0
    assert "GEMM templates" not in capsys.readouterr().out  # analytical compiles keep the library call


def test_the_state_bound_comes_from_the_option_or_the_environment(tmp_path, monkeypatch, capsys):
    # TESSERA_MAX_STATES sets the default (an A/B on a GPU machine); --max-states wins; a bad value is named
    from tessera.compiler import CompileOptions

    assert CompileOptions().max_states == 2000
    monkeypatch.setenv("TESSERA_MAX_STATES", "4000")
    assert CompileOptions().max_states == 4000
    out = tmp_path / "b"
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out), "--cost", "analytical",
                 "--max-states", "200"]) == 0
    assert len(json.loads((out / "plan.json").read_text())["subgraphs"]) > 1  # 200 states cut bert_tiny
    monkeypatch.setenv("TESSERA_MAX_STATES", "200")
    capsys.readouterr()
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out), "--cost", "analytical"]) == 0
    assert len(json.loads((out / "plan.json").read_text())["subgraphs"]) > 1
    monkeypatch.setenv("TESSERA_MAX_STATES", "many")
    assert main(["compile", str(MODELS / "bert_tiny.onnx"), "-o", str(out)]) == 2
    assert "TESSERA_MAX_STATES='many': the state bound must be a positive integer" in capsys.readouterr().err


def test_a_failed_16_bit_check_says_whether_the_precision_itself_is_past_the_tolerance(tmp_path, capsys):
    # (x + 256) @ I - 256: the product's operand is stored in bf16, whose step at 256 is 2, so x comes back
    # rounded to even numbers. The plan fails the check, and so would any: the reference interpreter storing
    # every tensor in bf16 is off as far, and the check says so instead of leaving a bare FAIL.
    import numpy as np
    from onnx import helper
    from opcheck import Const, graph_model

    model = graph_model([helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("MatMul", ["a", "eye"], ["m"]),
                         helper.make_node("Sub", ["m", "c"], ["y"])],
                        {"x": np.zeros((4, 8), np.float32), "c": Const(np.float32(256.0)),
                         "eye": Const(np.eye(8, dtype=np.float32))}, ["y"])
    path = tmp_path / "cancel.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "cancel"
    assert main(["compile", str(path), "-o", str(out), "--precision", "bf16", "--cost", "analytical"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--check", "--seed", "5"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "storing every tensor in bf16 is off by" in text
    assert "bf16 itself cannot hold this model within 0.01" in text
