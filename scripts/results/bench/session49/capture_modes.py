"""Session 49: what a failed CUDA-graph capture leaves behind, and which calls of a second thread
break a capture, per capture mode (global, thread_local). Each trial runs in a process of its own:
a failed capture leaves torch's state such that later trials in the same process would fail too.

  python capture_modes.py            all trials, one subprocess each, a table on stdout
  python capture_modes.py MODE KIND  one trial (what the subprocesses run)

KIND is a call the other thread makes in the middle of the capture (synchronize, malloc,
launch_default_stream, launch_own_stream, empty_cache), or `self_synchronize`: the capturing
thread synchronizes inside its own capture, through torch's graph context (MODE torch) or
tessera's `runtime.graphs.capture` (MODE tessera). After each trial: does `torch.randn` on the
GPU work, and is the thread's current stream the one it had before?"""
from __future__ import annotations

import subprocess
import sys
import threading

import torch

OTHER = ("none", "synchronize", "malloc", "launch_default_stream", "launch_own_stream", "empty_cache")


def other_call(kind: str) -> None:
    if kind == "none":  # the control: nothing
        return
    if kind == "synchronize":
        torch.cuda.synchronize()
    elif kind == "malloc":  # a size the caching allocator has no block for: cudaMalloc
        torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(int(7.7e8)))
    elif kind == "launch_default_stream":
        torch.ones(1024, device="cuda").add_(1)
    elif kind == "launch_own_stream":
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            torch.ones(1024, device="cuda").add_(1)
        s.synchronize()
    elif kind == "empty_cache":
        torch.cuda.empty_cache()


def first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:80]


def trial(mode: str, kind: str) -> str:
    a = torch.randn(256, 256, device="cuda")
    side = torch.cuda.Stream()  # cuBLAS's first call on a stream allocates its workspace: not in a capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a @ a
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    before = torch.cuda.current_stream()
    g = torch.cuda.CUDAGraph()
    other, cap = "-", "ok"
    if kind == "self_synchronize":
        try:
            if mode == "tessera":
                from tessera.runtime.graphs import capture
                with capture(g):  # on torch's own capture stream, which cuBLAS may not have seen
                    b = a @ a
                    torch.cuda.synchronize()
            else:
                with torch.cuda.graph(g):
                    b = a @ a
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - reported
            cap = f"failed: {first(e)}"
    else:
        inside, done = threading.Event(), threading.Event()
        res = {"other": "ok"}

        def run() -> None:
            inside.wait(30)
            try:
                other_call(kind)
            except Exception as e:  # noqa: BLE001 - reported
                res["other"] = f"raised: {first(e)}"
            done.set()

        t = threading.Thread(target=run)
        t.start()
        try:
            with torch.cuda.graph(g, stream=side, capture_error_mode=mode):
                b = a @ a
                inside.set()
                done.wait(30)
                c = b @ a
        except Exception as e:  # noqa: BLE001 - reported
            cap = f"failed: {first(e)}"
        finally:
            inside.set()
            t.join()
        other = res["other"]
        if cap == "ok":
            g.replay()
            torch.cuda.synchronize()
            ref = (a.double() @ a.double()) @ a.double()
            cap = f"ok, replay rel err {float((c.double() - ref).norm() / ref.norm()):.1e}"
    stream_back = torch.cuda.current_stream() == before
    try:
        torch.randn(8, device="cuda")
        torch.cuda.synchronize()
        rng = "ok"
    except Exception as e:  # noqa: BLE001 - reported
        rng = f"raised: {first(e)}"
    return f"other thread: {other} | capture: {cap} | then stream restored: {stream_back} | then randn: {rng}"


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    if len(sys.argv) == 3:
        print(trial(sys.argv[1], sys.argv[2]))
        sys.exit(0)
    cases = [(m, k) for m in ("global", "thread_local") for k in OTHER] + \
        [("torch", "self_synchronize"), ("tessera", "self_synchronize")]
    for m, k in cases:
        r = subprocess.run([sys.executable, __file__, m, k], capture_output=True, text=True, timeout=120)
        line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"exit {r.returncode}: {first(Exception(r.stderr[-300:]))}"
        print(f"{m:12s} {k:22s} {line}", flush=True)
