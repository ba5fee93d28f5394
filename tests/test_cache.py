"""The kernel cache: a size cap with least-recently-used eviction, safe with concurrent
processes (a kernel runs from memory; a file evicted or cleared is written again), and
`tessera cache info|clear`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from tessera import cache
from tessera.cli.main import main
from tessera.codegen.kernels import generate
from tessera.codegen.launch import TritonKernel, use_interpreter
from tessera.fission import fission
from tessera.frontend import load

KIB4 = 4096


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh cache root for this test, and this process's sweep state forgotten."""
    monkeypatch.setenv("TESSERA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TESSERA_CACHE_MAX_MB", raising=False)
    cache._reset_state(None)
    use_interpreter(torch.device("cpu"))  # the kernels here run on CPU tensors
    yield tmp_path / "cache"
    cache._reset_state(None)


def _tiny_kernel(scale: float, name: str = "k0_mul"):
    """A one-kernel graph y = x * scale, its generated source, and a feed."""
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [scale])]), opset_imports=[helper.make_opsetid("", 17)])
    g = fission(load(m).graph).graph
    return g, generate(g, g.nodes, list(g.outputs), name)


def _run(g, ks, kernel: TritonKernel | None = None) -> np.ndarray:
    x = torch.arange(64, dtype=torch.float32)
    env = {**{k: torch.from_numpy(np.array(v, np.float32)) for k, v in g.constants.items()}, "x": x}
    out = torch.empty(64)
    (kernel or TritonKernel(ks))(*[env[t] for t in ks.inputs], out)
    return out.numpy()


def _fill(d: Path, n: int, start: int = 0) -> list[Path]:
    return [cache.store(f"k{i}_fill_{i:012x}.py", f"# kernel {i}\n" + "x = 1\n" * 20) for i in range(start, start + n)]


def test_cap_evicts_least_recently_used(home, monkeypatch):
    monkeypatch.setenv("TESSERA_CACHE_MAX_MB", str(16 * KIB4 / 2**20))  # 16 files of one 4 KiB block
    cap = cache.cap_bytes()
    d = cache.kernel_dir()
    first = _fill(d, 8)
    for i in range(40):
        time.sleep(0.002)  # distinct modification times
        cache.store(first[0].name, "unused: the file exists")  # in use: touched, never evicted
        _fill(d, 1, start=100 + i)
        u = cache.usage()
        assert u.nbytes <= cap, (i, u)
    assert first[0].is_file() and first[0].read_text().startswith("# kernel 0")
    assert not any(p.is_file() for p in first[1:])  # older and unused: evicted first
    assert cache.usage().files >= int(cap * cache.LOW_WATER) // KIB4 - 1
    # Another process's estimate starts from what the last sweep recorded.
    assert cache._read_usage(d)[0] <= cap


def test_no_cap_and_a_bad_cap(home, monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_CACHE_MAX_MB", "0")
    assert cache.cap_bytes() is None
    _fill(cache.kernel_dir(), 30)
    assert cache.usage().files == 30
    monkeypatch.setenv("TESSERA_CACHE_MAX_MB", "lots")
    assert main(["cache", "info"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "TESSERA_CACHE_MAX_MB='lots'" in err and "Traceback" not in err


def test_an_evicted_kernel_runs_and_is_written_again(home):
    g, ks = _tiny_kernel(3.0)
    k = TritonKernel(ks)
    path = k.path
    assert path.parent == cache.kernel_dir() and path.read_text() == ks.source
    # Evicted between the load and the first launch (Triton's interpreter reads the source then):
    # the kernel runs from the source held in memory.
    path.unlink()
    np.testing.assert_array_equal(_run(g, ks, k), np.arange(64) * 3.0)
    # Evicted and cleared: the next load writes the file again.
    cache.clear()
    assert not path.exists()
    np.testing.assert_array_equal(_run(g, ks), np.arange(64) * 3.0)
    assert path.read_text() == ks.source


def test_a_load_touches_its_file(home):
    g, ks = _tiny_kernel(2.0)
    path = TritonKernel(ks).path
    os.utime(path, (1, 1))  # as if last used in 1970
    TritonKernel(ks)
    assert time.time() - path.stat().st_mtime < 60


_STRESS = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import numpy as np
from test_cache import _run, _tiny_kernel
from tessera import cache
for i in range(int(sys.argv[2])):
    g, ks = _tiny_kernel(float(i % 7 + 1), f"k{i}_mul")
    got = _run(g, ks)
    assert np.array_equal(got, np.arange(64) * float(i % 7 + 1)), i
    if sys.argv[3] == "clear" and i % 5 == 0:
        cache.clear()
print("ok")
"""


def test_concurrent_processes_sweep_and_clear_safely(home, monkeypatch):
    """Two processes load and run kernels under a cap of a few files while a third clears the cache
    again and again: nothing fails, and the folder stays near the cap."""
    monkeypatch.setenv("TESSERA_CACHE_MAX_MB", str(6 * KIB4 / 2**20))
    tests = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, "-c", _STRESS, tests, "40", mode], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for mode in ("run", "run", "clear")]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    # 120 files written; the cap is soft (writers between sweeps may pass it), not absent.
    assert cache.usage().nbytes <= 2 * 6 * KIB4


def test_cache_info_and_clear(home, monkeypatch, tmp_path, capsys):
    triton_dir = tmp_path / "triton"
    (triton_dir / "ABC").mkdir(parents=True)
    (triton_dir / "ABC" / "k.cubin").write_bytes(b"\0" * 5000)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
    monkeypatch.setenv("TESSERA_CACHE_MAX_MB", "64")
    _fill(cache.kernel_dir(), 5)
    (home / "tuning.db").write_bytes(b"measurements")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(cache.kernel_dir()) in out and "5 files" in out and "cap 64.0 MiB" in out
    assert str(triton_dir) in out and "1 files" in out
    assert main(["cache", "info", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == 5 and doc["bytes"] >= 5 * 20 and doc["cap_bytes"] == 64 << 20
    assert doc["triton"] == {"dir": str(triton_dir), "files": 1, "bytes": doc["triton"]["bytes"]}
    assert main(["cache", "clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 5 kernel files" in out and "freed" in out and "Triton" not in out
    assert cache.usage().files == 0 and (home / "tuning.db").read_bytes() == b"measurements"
    assert (triton_dir / "ABC" / "k.cubin").exists()
    assert main(["cache", "clear", "--triton"]) == 0
    out = capsys.readouterr().out
    assert "removed 0 kernel files" in out and "removed 1 files" in out
    assert triton_dir.is_dir() and not any(triton_dir.iterdir())
    assert main(["cache", "info", "--triton"]) == 2
    assert "--triton applies to tessera cache clear" in capsys.readouterr().err


def test_info_of_a_missing_cache_creates_nothing(home, capsys):
    assert main(["cache", "info"]) == 0
    assert "0 files" in capsys.readouterr().out and not home.exists()


def test_stale_temporary_files_are_swept(home):
    d = cache.kernel_dir()
    dead = d / "k0_x_000000000000.py.tmp999.1"
    dead.write_text("half a kernel")
    os.utime(dead, (1, 1))
    live = d / "k1_x_000000000000.py.tmp998.1"
    live.write_text("a kernel being written")
    cache.sweep()
    assert not dead.exists() and live.exists()
