"""scripts/bench_gpus.py: rows side by side, one per GPU, stopped at the deadline (a stand-in suite)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Stands in for bench_suite.py: records the GPU it saw, then sleeps the seconds its model names.
STAND_IN = """
import os, sys, time
from pathlib import Path
args = sys.argv[1:]
model, out = args[args.index("--models") + 1], Path(args[args.index("--out") + 1])
(out / "gpu.txt").write_text(os.environ["CUDA_VISIBLE_DEVICES"] + " " + " ".join(args))
(out / "cores.txt").write_text(" ".join(map(str, sorted(os.sched_getaffinity(0)))))
(out / "caches.txt").write_text(" ".join(os.environ.get(v, "-") for v in ("TESSERA_CACHE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")))
time.sleep(float(model.split("_s")[1]))
(out / "done.txt").write_text("ok")
"""


def run_rows(tmp_path: Path, rows: str, deadline_s: int, gpus: int, *flags: str) -> tuple[Path, list[str]]:
    """bench_gpus.py over `rows` with the stand-in suite: (its out folder, the lines it printed)."""
    suite = tmp_path / "suite.py"
    suite.write_text(STAND_IN)
    out = tmp_path / "out"
    mine = list(flags[:flags.index("--")]) if "--" in flags else list(flags)
    passed = list(flags[flags.index("--"):]) if "--" in flags else []
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_gpus.py"), "--rows", rows,
                          "--deadline-s", str(deadline_s), "--gpus", str(gpus), *mine, "--out", str(out),
                          "--suite", str(suite), *passed], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return out, res.stdout.splitlines()


def test_rows_share_gpus_and_stop_at_the_deadline(tmp_path: Path) -> None:
    # GPU 0 takes a_s1, then d_s1; GPU 1 takes b_s30, stopped at the 6 s deadline; c_s2 (estimate 50)
    # never fits, and d_s1 passes it in the queue.
    out, tail = run_rows(tmp_path, "a_s1:fp16=1,b_s30:tf32=2,c_s2:fp16=50,d_s1:fp16=1", 6, 2,
                         "--", "--fresh-db", "--code", "abc")
    assert "a_s1_fp16: exit 0" in tail and "d_s1_fp16: exit 0" in tail
    assert "b_s30_tf32: stopped at the deadline" in tail
    assert "c_s2_fp16: not started" in tail
    assert (out / "d_s1_fp16" / "done.txt").exists() and not (out / "b_s30_tf32" / "done.txt").exists()
    assert (out / "d_s1_fp16" / "gpu.txt").read_text().split()[0] == "0"
    c0 = set((out / "a_s1_fp16" / "cores.txt").read_text().split())
    c1 = set((out / "b_s30_tf32" / "cores.txt").read_text().split())
    assert c0 and c1 and not c0 & c1  # the two GPUs' rows run on separate cores
    seen = (out / "b_s30_tf32" / "gpu.txt").read_text().split()
    assert seen[0] == "1" and seen[-3:] == ["--fresh-db", "--code", "abc"]  # its own GPU; the suite's args pass through


def test_each_row_gets_its_share_of_the_cores() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_gpus import share

    cores = sorted(os.sched_getaffinity(0))
    parts = [share(g, 2) for g in range(2)]
    if len(cores) >= 2:
        assert parts[0] and parts[1] and not parts[0] & parts[1] and parts[0] | parts[1] <= set(cores)
    assert share(0, len(cores) + 1) == set()  # more GPUs than cores: no confinement


def test_cap_stops_a_row_at_its_estimate_and_frees_its_gpu(tmp_path: Path) -> None:
    # One GPU: a_s30 (estimate 2) is stopped at its cap, so b_s1 still runs before the 8 s deadline.
    out, tail = run_rows(tmp_path, "a_s30:fp16=2,b_s1:fp16=3", 8, 1, "--cap")
    assert "a_s30_fp16: stopped at its cap" in tail and "b_s1_fp16: exit 0" in tail
    assert (out / "b_s1_fp16" / "done.txt").exists() and not (out / "a_s30_fp16" / "done.txt").exists()


def test_cold_caches_are_per_row_and_removed_after(tmp_path: Path) -> None:
    out, _ = run_rows(tmp_path, "a_s0:fp16=5,b_s0:tf32=5", 20, 1, "--cold-caches")
    a, b = ((out / r / "caches.txt").read_text().split() for r in ("a_s0_fp16", "b_s0_tf32"))
    assert "-" not in a + b and len(set(a)) == 3 and not set(a) & set(b)  # three caches each, none shared
    assert not any(Path(p).parent.exists() for p in a + b)  # removed when the row ended


def test_only_keeps_a_run_to_the_gpus_it_names(tmp_path: Path) -> None:
    # Two GPUs, this run may use GPU 1 alone: both rows run there, one after the other, on GPU 1's
    # share of the cores (the other run on GPU 0 has the other share).
    out, tail = run_rows(tmp_path, "a_s0:fp16=5,b_s0:tf32=5", 20, 2, "--only", "1")
    assert "a_s0_fp16: exit 0" in tail and "b_s0_tf32: exit 0" in tail
    for row in ("a_s0_fp16", "b_s0_tf32"):
        assert (out / row / "gpu.txt").read_text().split()[0] == "1"
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_gpus import share

    assert set((out / "a_s0_fp16" / "cores.txt").read_text().split()) == {str(c) for c in share(1, 2)} or not share(1, 2)

