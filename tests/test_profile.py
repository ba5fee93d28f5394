"""`tessera profile`: kernels by kind, attributed to plan kernels (CPU profile here; GPU on the device)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import helper
from opcheck import Const, graph_model, models_dir, rand

import tessera
from tessera.cli.main import main
from tessera.runtime.profile import (KINDS, format_profile, kernel_kind, misaligned, profile_callable,
                                     profile_executable, short_name)

# Real kernel names, as the H100 profiler printed them (some cut short), with their kinds.
NAMES = [
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
     "operator()() const::{lambda(float)#1}> >(int, at::native::gpu_kernel_impl_nocast<...>)", "layout copy", False),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
     "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)", "layout copy", False),
    ("nhwcToNchwKernel", "layout copy", False),
    ("void cudnn::engines_precompiled::tensorTransformGeneric<float, float, float, true, false, false>",
     "layout copy", False),
    ("cutlass_80_wmma_tensorop_f16_s161616gemm_f16_32x32_128x1_tn_align2", "library GEMM", True),
    ("cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align1", "library GEMM", True),
    ("nvjet_sm90_hss_128x128_64x4_1x2_h_bz_coopA_NNT", "library GEMM", False),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel",
     "library GEMM", False),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float>", "library GEMM", False),
    ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x64_warpgroupsize1x1x1_g1_"
     "execute_segment_k_off_kernel__5x_cudnn", "library conv", False),
    ("sm80_xmma_fprop_implicit_gemm_indexed_f32f32_f32f32_f32_nchwkcrs_nchw_tilesize32x32x8_stage3_warpsize1x2x1_"
     "g1_ffma_aligna4_alignc4_execute_kernel__5x_cudnn", "library conv", False),
    ("void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, false, true>", "library conv", False),
    ("void convolve_common_engine_float_NHWC<float, float, 1024, 5, 5, 3, 3, 3, true, false>", "library conv", False),
    ("void at::native::conv_depthwise2d_forward_kernel<1, float, int>", "library conv", False),
    ("triton_poi_fused_convolution_relu_4", "generated", False),
    ("triton_red_fused__native_batch_norm_legit_0", "generated", False),
    ("k12_conv_add", "generated", False),
    ("k0_pad", "generated", False),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::"
     "CUDAFunctor_add<float> >(at::TensorIteratorBase&, at::native::CUDAFunctor_add<float> const&)>", "other", False),
    ("Memcpy DtoD (Device -> Device)", "other", False),
    ("void cudnn::bn_fw_inf_1C11_kernel_NCHW<float, float, true, 1>", "other", False),
    ("aten::conv2d", "library conv", False),
    ("aten::addmm", "library GEMM", False),
    ("aten::copy_", "layout copy", False),
]


@pytest.mark.parametrize("name,kind,bad", NAMES, ids=[n[:40] for n, _, _ in NAMES])
def test_kernel_kind_on_real_names(name, kind, bad):
    assert kernel_kind(name) == kind
    assert misaligned(name) is bad


def test_short_names_keep_what_tells_kernels_apart():
    assert short_name(NAMES[0][0]) == "elementwise_kernel<direct_copy_kernel_cuda>"
    assert short_name(NAMES[1][0]) == "cudnn::ops::nchwToNhwcKernel"
    assert short_name("k12_conv_add") == "k12_conv_add"
    assert len(short_name("x" * 300)) <= 64


def _tiny(path):
    """conv (a library call) -> add, ReLU, softmax, flatten, tanh (generated): two plan kernels."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "y"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Softmax", ["r"], ["s"], axis=-1),
             helper.make_node("Flatten", ["s"], ["f"]),
             helper.make_node("Tanh", ["f"], ["out"])]
    m = graph_model(nodes, {"x": rand(1, 4, 8, 8), "w": Const(rand(8, 4, 3, 3, seed=1)), "y": rand(1, 8, 8, 8)},
                    ["out"])
    onnx.save(m, str(path))
    return path


def _sums_hold(p):
    assert sum(p.by_kind.values()) == pytest.approx(p.total_us)
    assert set(p.by_kind) == set(KINDS)
    if p.plan:  # tessera: plan kernels and what could not be attributed make up the total
        assert sum(r.us for r in p.plan) + p.unattributed_us == pytest.approx(p.total_us)


def test_cpu_profile_attributes_ops_to_every_plan_kernel(tmp_path):
    exe = tessera.compile(_tiny(tmp_path / "tiny.onnx"), tessera.CompileOptions(cost="analytical"))
    p = profile_executable(exe, {"x": torch.randn(1, 4, 8, 8), "y": torch.randn(1, 8, 8, 8)}, reps=1)
    assert p.device == "cpu" and p.attribution == "range" and "not GPU time" in p.note
    assert [r.name for r in p.plan] == [s.impl.name for s in exe.steps]
    assert all(r.us > 0 and r.kernels for r in p.plan)
    assert {k.plan_kernel for k in p.kernels} == {s.impl.name for s in exe.steps}
    assert p.by_kind["generated"] > 0 and p.by_kind["library conv"] > 0  # the interpreter; aten::conv2d
    _sums_hold(p)
    assert exe.annotate is False
    text = format_profile(p)
    assert "CPU/interpreter profile" in text and "not a benchmark" in text and exe.steps[0].impl.name in text
    doc = json.loads(json.dumps(p.to_json()))
    assert doc["device"] == "cpu" and doc["layout_copy_us"] == p.layout_copy_us and doc["plan"]


def test_cpu_profile_of_a_peer():
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 2))
    x = torch.randn(1, 3, 8, 8)
    p = profile_callable(lambda: net(x), reps=2, device="cpu", source="eager")
    assert p.source == "eager" and p.device == "cpu" and not p.plan
    assert p.by_kind["library conv"] > 0 and p.by_kind["library GEMM"] > 0
    _sums_hold(p)


def test_cli_profile_artifact_and_mistakes(tmp_path, capsys):
    model = _tiny(tmp_path / "tiny.onnx")
    out = tmp_path / "art"
    assert main(["compile", str(model), "-o", str(out), "--cost", "analytical"]) == 0
    capsys.readouterr()
    assert main(["profile", str(out), "--device", "cpu", "--json", str(tmp_path / "p.json")]) == 0
    text = capsys.readouterr().out
    assert "CPU/interpreter profile" in text and "by kind" in text and "plan kernels" in text
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["device"] == "cpu" and doc["precision"] == "fp32" and len(doc["plan"]) == 2
    assert main(["profile", str(tmp_path / "missing"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing" in err and "Traceback" not in err
    assert main(["profile", str(out), "--device", "cpu", "--precision", "fp16"]) == 2
    assert "compiled for fp32" in capsys.readouterr().err


def test_bench_profile_adds_run_profiles_and_the_kinds_table(tmp_path, capsys):
    out = tmp_path / "bench_mlp_tiny_fp32.json"
    assert main(["bench", "zoo:mlp_tiny", "--precision", "fp32", "--vs", "eager", "--strategy", "optimal",
                 "--cost", "analytical", "--device", "cpu", "--profile", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    for e in doc["entries"]:
        assert e["extra"]["run_profile"]["device"] == "cpu" and e["extra"]["run_profile"]["total_us"] > 0
    assert "profile" in doc["entries"][0]["extra"]  # the tuning-database profile stays
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_suite.py"
    r = subprocess.run([sys.executable, str(script), "--table", "--kinds", str(out)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "by kernel kind" in r.stdout and "| mlp_tiny | fp32 |" in r.stdout.split("by kernel kind")[1]
    assert "- rows: 1; tessera ahead of the best peer in" in r.stdout and "geomean tessera / best peer" in r.stdout


def test_suite_targets_take_the_geomean_and_count_max_autotune(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_suite", Path(__file__).resolve().parents[1] / "scripts" / "bench_suite.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)

    def row(model, ratio, ms, autotune_ms=None, passed=True, peer_gpu_us=None):
        entries = [{"name": "tessera-optimal-precisionio", "ms": ms, "passed": passed, "vs_best_peer": ratio}]
        if autotune_ms is not None:
            entries.append({"name": "inductor-max-autotune", "ms": autotune_ms, "passed": True})
        for i, us in enumerate(peer_gpu_us or []):  # peers' run profiles: their GPU kernel time per call
            entries.append({"name": f"peer{i}", "ms": 9.0, "passed": True,
                            "extra": {"run_profile": {"device": "cuda", "total_us": us}}})
        f = tmp_path / f"bench_{model}.json"
        f.write_text(json.dumps({"model": model, "precision": "fp16", "entries": entries}))
        return f

    files = [row("a", 0.5, 1.0, autotune_ms=2.0), row("b", 2.0, 4.0, autotune_ms=3.0, passed=False), row("c", 0.25, 1.0)]
    text = suite.targets(files)
    assert "- rows: 3; tessera ahead of the best peer in 2 of them" in text
    assert "geomean tessera / best peer: 0.630 (1.59x faster)" in text  # (0.5 * 2 * 0.25) ** (1/3)
    assert "max-autotune finished in 2 rows; tessera faster in 1" in text
    assert "failed its check in: b fp16" in text
    assert "GPU kernel time alone" not in text  # no row has a peer's GPU profile
    # against the least GPU time of any peer: 1000/800 and 1000/4000
    text = suite.targets([row("d", 0.5, 1.0, peer_gpu_us=[900.0, 800.0]), row("e", 0.5, 1.0, peer_gpu_us=[4000.0])])
    assert "GPU kernel time alone (run profiles, 2 rows): tessera ahead in 1, geomean 0.559 (1.79x faster)" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_profile_attributes_every_kernel(tmp_path):
    # The profile runs in a fresh process without TRITON_INTERPRET: once Triton's interpreter has run
    # a kernel in this one (the CPU tests above), it leaves triton.language patched and GPU compiles fail.
    out = tmp_path / "candy"
    assert main(["compile", str(models_dir() / "candy_small.onnx"), "-o", str(out), "--cost", "analytical",
                 "--solver", "highs"]) == 0
    r = subprocess.run([sys.executable, "-m", "tessera", "profile", str(out), "--device", "cuda", "--reps", "5",
                        "--json", str(tmp_path / "p.json")], capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert r.returncode == 0, r.stderr
    assert "CUDA-graph replays" in r.stdout
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["device"] == "cuda" and p["attribution"] == "order"
    assert p["unattributed_us"] == 0 and all(k["plan_kernel"] for k in p["kernels"])
    assert sum(p["by_kind"].values()) == pytest.approx(p["total_us"])
    assert sum(r["us"] for r in p["plan"]) == pytest.approx(p["total_us"])
    assert p["by_kind"]["generated"] > 0 and p["by_kind"]["library conv"] > 0
    plan = json.loads((out / "plan.json").read_text())
    launched = {r["name"] for r in p["plan"] if r["kernels"]}
    assert {k["name"] for k in plan["kernels"] if k.get("backend") != "view"} <= launched
    assert 0 < p["total_us"] <= p["wall_us"] * 1.05  # the GPU works inside the wall time
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).cuda()
    x = torch.randn(1, 3, 64, 64, device="cuda")
    peer = profile_callable(lambda: net(x), reps=5, source="eager")
    assert peer.device == "cuda" and peer.total_us > 0 and peer.by_kind["library conv"] > 0
    _sums_hold(peer)


def test_bound_feeds_copy_nothing_before_a_replay():
    # The eager sequence that profile attribution matches by order counts the input copies only
    # when a replay makes them: not for feeds that are the graph's own buffers (bind_inputs).
    from types import MethodType, SimpleNamespace

    from tessera.runtime.executable import Executable
    from tessera.runtime.profile import copies_before_replay

    def exe_like(cuda_graph: bool, captured: bool, buffers: dict) -> SimpleNamespace:
        # an executable's state after bind_inputs (a CUDA graph needs a GPU: stand-ins here)
        exe = SimpleNamespace(cuda_graph=cuda_graph, _graph=object() if captured else None, _static_in=buffers)
        exe.inputs_bound = MethodType(Executable.inputs_bound, exe)
        return exe

    a, b = torch.zeros(2), torch.zeros(3)
    exe = exe_like(True, True, {"x": a, "y": b})
    assert exe.inputs_bound({"x": a, "y": b}) and not copies_before_replay(exe, {"x": a, "y": b})
    assert copies_before_replay(exe, {"x": a, "y": b.clone()})
    assert copies_before_replay(exe_like(True, False, {}), {"x": a})  # not captured yet: the capture copies
    assert not copies_before_replay(exe_like(False, False, {}), {"x": a})


class _Ev:
    """A stand-in for a profiler's device event: a name and a span."""

    def __init__(self, name: str, start: float, us: float) -> None:
        from types import SimpleNamespace

        self.name = name
        self.time_range = SimpleNamespace(start=start, end=start + us, elapsed_us=lambda: us)


def _timeline(pairs: list[tuple[str, float]]) -> list[_Ev]:
    """(name, µs) events one after another on the GPU, 1 µs apart."""
    out, t = [], 0.0
    for name, us in pairs:
        out.append(_Ev(name, t, us))
        t += us + 1.0
    return out


def test_attribution_lines_up_sequences_that_differ_a_little():
    from tessera.runtime.profile import _attribute

    # The eager run launched gemm for k1 and k3 (one name, two plan kernels); under capture k2's
    # library call picked another kernel, and a memset appeared after k4. By position, k1's gemm
    # and k3's gemm keep their own times; by name they would be averaged.
    expected = [("k0", "a"), ("k1", "gemm"), ("k2", "conv_x"), ("k3", "gemm"), ("k4", "b"),
                ("k5", "c"), ("k6", "d"), ("k7", "e"), ("k8", "f"), ("k9", "g")]
    one = [("a", 1.0), ("gemm", 10.0), ("conv_y", 3.0), ("gemm", 30.0), ("b", 1.0), ("memset", 0.5),
           ("c", 1.0), ("d", 1.0), ("e", 1.0), ("f", 1.0), ("g", 1.0)]
    replay = _timeline(one + one)
    rows, how = _attribute(expected, replay, 2)
    assert how == "aligned"
    got = {(pk, name): us for pk, name, us, _ in rows}
    assert got[("k1", "gemm")] == 10.0 and got[("k3", "gemm")] == 30.0
    assert got[("k2", "conv_y")] == 3.0  # k2's slot: what its library call launched under capture
    assert got[(None, "memset")] == 0.5  # inserted: no eager kernel launched it
    assert sum(us for *_, us, _ in rows) == pytest.approx(sum(us for _, us in one))
    # Exact repeats are matched by order; replays that differ from each other fall back to names.
    exact = _timeline([(n, 1.0) for _ in range(2) for _, n in expected])
    assert _attribute(expected, exact, 2)[1] == "order"
    assert _attribute(expected, _timeline(one + one[:-1] + [("h", 1.0)]), 2)[1] == "name"


def test_bench_times_every_contender_before_any_profile(monkeypatch):
    # A torch.profiler session leaves CUPTI attached in a process with CUDA graphs, slowing the host
    # of whatever is timed after it: the bench profiles only once every contender is timed.
    import tessera.bench as bench_mod

    events: list[str] = []
    real_ms, real_exe, real_call = bench_mod.median_ms, bench_mod.profile_executable, bench_mod.profile_callable
    monkeypatch.setattr(bench_mod, "median_ms", lambda fn, dev: (events.append("time"), real_ms(fn, dev))[1])
    monkeypatch.setattr(bench_mod, "profile_executable",
                        lambda *a, **k: (events.append("profile"), real_exe(*a, **k))[1])
    monkeypatch.setattr(bench_mod, "profile_callable", lambda *a, **k: (events.append("profile"), real_call(*a, **k))[1])
    doc = bench_mod.bench("zoo:mlp_tiny", "fp32", peers=["eager"], strategies=["optimal", "greedy"], cost="analytical",
                          device="cpu", run_profile=True)
    assert events == ["time"] * 3 + ["profile"] * 3
    assert all(e["extra"]["run_profile"]["total_us"] > 0 for e in doc["entries"])
