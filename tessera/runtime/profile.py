"""What really runs: each CUDA kernel's time per call, by kind and by the plan kernel that launched it.

The tuning database holds candidate kernels timed alone; it misses every copy the runtime adds and
every library kernel cuBLAS or cuDNN picks at run time. This profile measures what the executable
(or a PyTorch peer) launches:

- on a GPU, one eager run of the annotated steps (`Executable.annotate`: each step inside
  `record_function(plan kernel name)`) says which CUDA kernels each plan kernel launches; then
  `reps` replays of the CUDA graph give each kernel's GPU time (its exposed time: the part of its
  span after every kernel before it ended, `exposed_us`). A graph on one stream runs its
  kernels in capture order, so replay kernels map to plan kernels by position; where the
  sequences differ a little, by the positions that line up (the rest by name); else by name;
- on a CPU there are no CUDA kernels: the same ranges attribute host time to plan kernels, with
  generated kernels running in Triton's interpreter. That is a CPU profile, not GPU time and not
  a benchmark, and the result says so (`device: "cpu"`).

torch.profiler API relied on (checked with torch 2.11 on an H100 and 2.13 on a CPU): `prof.events()`,
FunctionEvents with `name`, `device_type`, `time_range` (µs), `is_user_annotation`, `cpu_children`
and `id`. On a GPU, kineto also emits each record_function range as a GPU-side span (device CUDA,
`is_user_annotation`) around the kernels launched inside it: that span attributes eager kernels.
A kernel and the runtime call that launched it share an `id` (CUPTI's correlation id), the fallback.
Triton kernels are launched outside any ATen op, so the CPU op a kernel links to cannot be used.
"""
from __future__ import annotations

import difflib
import re
import time
from bisect import bisect_right
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from tessera.runtime.executable import Executable

KINDS = ("generated", "library GEMM", "library conv", "layout copy", "other")

# Kernel name -> kind. The first pattern that matches wins, so the order matters: generated before
# "conv" (k1_conv_add is tessera's), layout copies before cuDNN (cudnn's nchwToNhwcKernel is a
# copy), convolutions before GEMMs (cuDNN's implicit_gemm is a convolution). Staging of the inputs
# ("Memcpy DtoD", Inductor's foreach Copy into a CUDA graph's static inputs) stays "other".
PATTERNS: tuple[tuple[str, str], ...] = (
    # tessera's Triton kernels carry their plan kernel's name: k12_conv_add.
    ("generated", r"^k\d+_"),
    # Triton kernels in general: Inductor's triton_poi_/triton_red_/triton_per_/triton_tem_fused_*.
    ("generated", r"triton"),
    # ATen's copy_ between layouts or dtypes: .contiguous(), channels_last, as_layout.
    ("layout copy", r"direct_copy_kernel"),
    # cuDNN converting a convolution's operands or result between NCHW and NHWC.
    ("layout copy", r"nchwToNhwc|nhwcToNchw"),
    # cuDNN's generic transform: a layout change or padding of a tensor.
    ("layout copy", r"tensorTransformGeneric"),
    # CPU profiles: the same copies as ATen ops.
    ("layout copy", r"^aten::(copy_|contiguous|clone|_to_copy)$"),
    # cuDNN kernels that are no convolution: batch norm (bn_fw_inf), attention (sdpa).
    ("other", r"bn_fw|bn_bw|batch_?norm|sdpa"),
    # cuDNN and cutlass convolutions: implicit-GEMM forward props, Winograd, depthwise, ATen's convs.
    ("library conv", r"conv(?!ert)|fprop|implicit_gemm|cudnn|winograd|depthwise"),
    # cuBLAS, cuBLASLt and cutlass GEMMs: sm90_xmma_gemm, nvjet_*, ampere_sgemm, gemv, split-K reductions.
    ("library GEMM", r"gemm|gemv|nvjet|cublas|cutlass|splitKreduce|dot_kernel"),
    # CPU profiles: ATen's matrix products.
    ("library GEMM", r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_addmm_activation)$"),
)
_COMPILED = [(kind, re.compile(p, re.IGNORECASE)) for kind, p in PATTERNS]
# A library GEMM built for 1- or 2-element alignment: cuBLAS's fallback when a leading dimension or
# a pointer is not 16-byte aligned (align1, align2, alignc2; not align16 or aligna4).
MISALIGNED = re.compile(r"align[a-z]?[12](?!\d)")
# CUDA runtime and driver calls that launch work (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync):
# the profiler gives each the CUPTI correlation id of the kernel it launched.
RUNTIME_CALL = re.compile(r"^cu(da)?[A-Z]")

INPUTS = "(inputs)"  # the range of run_static's copy of the feeds into the graph's input buffers


def kernel_kind(name: str) -> str:
    """One of KINDS for a CUDA kernel name (or an ATen op name, in a CPU profile)."""
    return next((kind for kind, p in _COMPILED if p.search(name)), "other")


def misaligned(name: str) -> bool:
    """A library GEMM kernel built for 1- or 2-element alignment."""
    return kernel_kind(name) == "library GEMM" and MISALIGNED.search(name) is not None


@dataclass
class KernelTime:
    """One kernel (per plan kernel that launched it): time and launches per call."""
    name: str
    kind: str
    us: float
    calls: float
    plan_kernel: str | None = None  # None: a peer's kernel, or one that could not be attributed
    misaligned: bool = False


@dataclass
class PlanKernelTime:
    name: str
    backend: str
    us: float
    by_kind: dict[str, float]
    kernels: list[str]  # the CUDA kernels (ops, on a CPU) it launched, in order


@dataclass
class Profile:
    source: str  # "tessera" or the peer's name
    device: str  # "cuda": GPU kernel time; "cpu": host time of ops (Triton's interpreter), no GPU time
    reps: int
    wall_us: float  # per call: CUDA events (perf_counter on a CPU) around `reps` calls, divided
    # per call: the kernels' summed time, each kernel's the part of its span after every kernel before it
    # ended (`exposed_us`; on a GPU the sum is `busy_us`; on a CPU, host time of ops)
    total_us: float
    by_kind: dict[str, float]
    kernels: list[KernelTime]  # most expensive first
    plan: list[PlanKernelTime] = field(default_factory=list)  # tessera: in plan order
    unattributed_us: float = 0.0
    attribution: str = "none"  # "order", "aligned", "name", "range" (CPU) or "none" (peer)
    note: str = ""
    # per call: the time at least one kernel ran (the union of their spans), `total_us` on a GPU
    busy_us: float = 0.0
    # per call: the kernels' spans summed. Under programmatic dependent launch a kernel starts while the
    # one before runs and waits for it, so its span counts that wait and this sum counts overlaps twice.
    span_us: float = 0.0

    @property
    def layout_copy_us(self) -> float:
        return self.by_kind.get("layout copy", 0.0)

    @property
    def misaligned_gemm_us(self) -> float:
        return sum(k.us for k in self.kernels if k.misaligned)

    def top(self, n: int = 15) -> list[KernelTime]:
        return self.kernels[:n]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "layout_copy_us": self.layout_copy_us, "misaligned_gemm_us": self.misaligned_gemm_us}


def _kernel_times(items: list[tuple[str | None, str, float, float]], kinds: Mapping[str, str] | None = None
                  ) -> list[KernelTime]:
    """(plan kernel, name, µs per call, calls per call) rows merged by (plan kernel, name)."""
    acc: dict[tuple[str | None, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for plan_kernel, name, us, calls in items:
        acc[plan_kernel, name][0] += us
        acc[plan_kernel, name][1] += calls
    rows = [KernelTime(name, (kinds or {}).get(name) or kernel_kind(name), us, calls, pk, misaligned(name))
            for (pk, name), (us, calls) in acc.items()]
    return sorted(rows, key=lambda k: -k.us)


def _by_kind(kernels: list[KernelTime]) -> dict[str, float]:
    out = {k: 0.0 for k in KINDS}
    for k in kernels:
        out[k.kind] += k.us
    return out


def exposed_us(events: list[Any]) -> list[float]:
    """Per event (GPU start order), the µs of its span after every earlier event ended: what it adds to
    the GPU's timeline. Under programmatic dependent launch a kernel starts while the one before runs
    and waits for it; its span counts that wait, its exposed time does not. They sum to `busy_us`."""
    out, end = [], float("-inf")
    for e in events:
        start, stop = e.time_range.start, e.time_range.end
        out.append(max(0.0, stop - max(start, end)))
        end = max(end, stop)
    return out


def busy_us(events: list[Any]) -> float:
    """µs during which at least one of `events` (GPU start order) ran: the union of their spans."""
    return sum(exposed_us(events))


def _device_events(prof: profile) -> list[Any]:
    """CUDA kernels, memcpys and memsets in GPU start order; not the GPU spans of annotations."""
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return sorted(evs, key=lambda e: e.time_range.start)


def _containing(spans: list[tuple[float, float, str]], t: float) -> str | None:
    """The name of the span around time `t`; spans sorted by start, not overlapping."""
    i = bisect_right(spans, (t, float("inf"), "")) - 1
    return spans[i][2] if i >= 0 and spans[i][0] <= t <= spans[i][1] else None


def copies_before_replay(exe: Executable, feeds: Mapping[str, torch.Tensor]) -> bool:
    """Whether `run_static(feeds)` copies inputs into the captured graph's buffers: a CUDA graph whose
    feeds are not those buffers. Bound feeds (`bind_inputs`) copy nothing, so the eager sequence must
    not count copies either, or it has more entries than a replay and matching by order fails (every
    suite row of session 31 fell back to matching by name)."""
    return exe.cuda_graph and not exe.inputs_bound(feeds)


def _eager_sequence(exe: Executable, feeds: Mapping[str, torch.Tensor]) -> list[tuple[str | None, str]]:
    """(plan kernel, CUDA kernel name) for each kernel one eager run launches, in GPU order.

    Each step runs inside `record_function(name)`; kineto draws that range on the GPU as a span
    around the kernels launched inside it, and on one stream the spans do not overlap. Failing that,
    a kernel belongs to the host range around the runtime call that launched it (same event id).
    The copy of the feeds that run_static makes before a replay, when it makes one, runs here too,
    in its own range."""
    names = {s.impl.name for s in exe.steps} | {INPUTS}
    copies = copies_before_replay(exe, feeds)
    saved = exe.annotate, exe.cuda_graph
    exe.annotate, exe.cuda_graph = True, False
    try:
        exe.run_static(feeds)  # warm: allocator, cuBLAS handles, workspaces
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with record_function(INPUTS):
                staged = {k: torch.empty_like(v).copy_(v) for k, v in feeds.items()} if copies else feeds
                if saved[1]:  # a replay checks the index inputs first, at the head of its graph
                    exe.launch_index_checks(staged)
            exe.run_static(staged)
            torch.cuda.synchronize()
    finally:
        exe.annotate, exe.cuda_graph = saved
    events = prof.events()
    spans = {dev: sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                         if e.device_type == dev and e.is_user_annotation and e.name in names)
             for dev in (DeviceType.CUDA, DeviceType.CPU)}
    launch = {e.id: e.time_range.start for e in events
              if e.device_type == DeviceType.CPU and RUNTIME_CALL.match(e.name)}
    out = []
    for k in _device_events(prof):
        owner = _containing(spans[DeviceType.CUDA], (k.time_range.start + k.time_range.end) / 2)
        if owner is None and k.id in launch:
            owner = _containing(spans[DeviceType.CPU], launch[k.id])
        out.append((owner, k.name))
    return out


def _attribute(expected: list[tuple[str | None, str]], replay: list[Any], reps: int
               ) -> tuple[list[tuple[str | None, str, float, float]], str]:
    """Replay kernels -> (plan kernel, name, µs per call, calls per call), and how they were matched:
    "order" when each replay repeats the eager sequence exactly; "aligned" when every replay
    launches the same sequence and most of it lines up with the eager one (a library that picked
    another kernel under capture, an extra memset): the kernels that line up keep their plan kernel
    by position, the rest go by name; "name" otherwise."""
    us = exposed_us(replay)
    aligned = _aligned(expected, [e.name for e in replay], us, reps)
    if aligned is not None:
        return aligned
    return _by_name(expected, list(zip((e.name for e in replay), us)), reps), "name"


def _aligned(expected: list[tuple[str | None, str]], replay: list[str], exposed: list[float], reps: int
             ) -> tuple[list[tuple[str | None, str, float, float]], str] | None:
    """Attribution by lining up the eager sequence's names with one replay's (difflib's opcodes),
    when every replay launches the same names and at least 90% of the eager sequence lines up;
    None otherwise. Equal runs keep their plan kernels by position ("order" when that is all of
    both); a replaced run goes to its eager run's plan kernel when that is one kernel, else by name
    within it; an inserted kernel (no eager counterpart, such as a memset only the capture makes)
    is nobody's."""
    if not expected or not replay or len(replay) % reps:
        return None
    m = len(replay) // reps
    names = replay[:m]
    if any(replay[r * m + j] != names[j] for r in range(1, reps) for j in range(m)):
        return None
    ops = difflib.SequenceMatcher(None, [x for _, x in expected], names, autojunk=False).get_opcodes()
    if sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag == "equal") < 0.9 * len(expected):
        return None
    us = [sum(exposed[r * m + j] for r in range(reps)) / reps for j in range(m)]
    rows: list[tuple[str | None, str, float, float]] = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            rows += [(expected[i1 + k][0], names[j1 + k], us[j1 + k], 1.0) for k in range(j2 - j1)]
            continue
        owners = {pk for pk, _ in expected[i1:i2]}
        if len(owners) == 1:
            (pk,) = owners
            rows += [(pk, names[j], us[j], 1.0) for j in range(j1, j2)]
        else:
            rows += _by_name(expected[i1:i2], [(names[j], us[j]) for j in range(j1, j2)], 1)
    exact = m == len(expected) and all(tag == "equal" for tag, *_ in ops)
    return rows, "order" if exact else "aligned"


def _by_name(expected: list[tuple[str | None, str]], replay: list[tuple[str, float]], reps: int
             ) -> list[tuple[str | None, str, float, float]]:
    """Each name's time split among the plan kernels that launched it in the eager run, by their
    launch counts ((name, µs) rows over `reps` calls); a name no plan kernel launched is nobody's."""
    launches: dict[str, dict[str | None, int]] = defaultdict(lambda: defaultdict(int))
    for pk, name in expected:
        launches[name][pk] += 1
    per_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, us in replay:
        per_name[name][0] += us / reps
        per_name[name][1] += 1 / reps
    rows = []
    for name, (us, calls) in per_name.items():
        owners = launches.get(name) or {None: 1}
        total = sum(owners.values())
        rows += [(pk, name, us * c / total, calls * c / total) for pk, c in owners.items()]
    return rows


def _wall_us(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Per call, around `reps` back-to-back calls (host launch overhead included)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / reps
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) * 1e6 / reps


def _plan_rows(exe: Executable, rows: list[tuple[str | None, str, float, float]],
               kinds: Mapping[str, str] | None = None) -> list[PlanKernelTime]:
    """Per plan kernel, in plan order, from (plan kernel, name, µs, calls) rows in launch order."""
    out = {INPUTS: PlanKernelTime(INPUTS, "copy", 0.0, {}, [])}
    out.update((s.impl.name, PlanKernelTime(s.impl.name, s.impl.backend, 0.0, {}, [])) for s in exe.steps)
    for pk, name, us, _ in rows:
        if pk in out:
            r, kind = out[pk], (kinds or {}).get(name) or kernel_kind(name)
            r.us += us
            r.by_kind[kind] = r.by_kind.get(kind, 0.0) + us
            if name not in r.kernels:
                r.kernels.append(name)
    return [r for r in out.values() if r.name != INPUTS or r.kernels]


def profile_executable(exe: Executable, feeds: Mapping[str, Any], reps: int = 30, bind: bool = True) -> Profile:
    """Where one call of `exe` spends its time, kernel by kernel (see the module's docstring). With
    `bind`, the inputs sit in the executable's own buffers (`Executable.bind_inputs`), so the calls
    copy none in; without, each call copies them, as `exe(...)` does."""
    feeds = exe.prepare_inputs(**feeds)
    if bind:
        feeds = exe.bind_inputs(feeds)
    exe.run_static(feeds)  # compiles every kernel; on a GPU, captures the graph
    if exe.device.type != "cuda":
        return _cpu_profile(exe, feeds, reps)
    torch.cuda.synchronize()
    wall = _wall_us(lambda: exe.run_static(feeds), reps, exe.device)
    expected = _eager_sequence(exe, feeds)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            exe.run_static(feeds)
        torch.cuda.synchronize()
    events = _device_events(prof)
    rows, how = _attribute(expected, events, reps)
    kernels = _kernel_times(rows)
    total = sum(k.us for k in kernels)
    return Profile("tessera", "cuda", reps, wall, total, _by_kind(kernels), kernels, _plan_rows(exe, rows),
                   sum(k.us for k in kernels if k.plan_kernel is None), how,
                   f"GPU time per call over {reps} {'CUDA-graph replays' if exe.cuda_graph else 'eager runs'}; "
                   f"kernels matched to plan kernels by {how}", busy_us(events) / reps,
                   sum(e.time_range.elapsed_us() for e in events) / reps)


def _split_range(ev: Any, own_kind: str | None) -> list[tuple[str, str, float]]:
    """A host range -> (name, kind, µs): its direct child ops, and the rest of its time as "(host)".

    `own_kind` set: the range runs a generated kernel in Triton's interpreter, whose own torch calls
    are the interpreter's, not the model's; only library children keep their names, and the rest
    goes under the range's (plan kernel's) name with that kind."""
    out, rest = [], ev.time_range.elapsed_us()
    for c in ev.cpu_children:
        kind = kernel_kind(c.name)
        if own_kind is None or kind.startswith("library"):
            out.append((c.name, kind, c.time_range.elapsed_us()))
            rest -= c.time_range.elapsed_us()
    out.append((ev.name if own_kind else "(host)", own_kind or "other", max(rest, 0.0)))
    return out


def _cpu_profile(exe: Executable, feeds: Mapping[str, torch.Tensor], reps: int) -> Profile:
    wall = _wall_us(lambda: exe.run_static(feeds), reps, exe.device)
    steps = {s.impl.name: s for s in exe.steps}
    saved, exe.annotate = exe.annotate, True
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                exe.run_static(feeds)
    finally:
        exe.annotate = saved
    rows: list[tuple[str | None, str, float, float]] = []
    kinds: dict[str, str] = {}
    for ev in prof.events():
        step = steps.get(ev.name)
        if step is None or ev.device_type != DeviceType.CPU:
            continue
        for name, kind, us in _split_range(ev, "generated" if step.kernel is not None else None):
            kinds.setdefault(name, kind)
            rows.append((ev.name, name, us / reps, 1 / reps))
    kernels = _kernel_times(rows, kinds)
    return Profile("tessera", "cpu", reps, wall, sum(k.us for k in kernels), _by_kind(kernels), kernels,
                   _plan_rows(exe, rows, kinds), 0.0, "range",
                   "CPU profile: host time of each plan kernel's ops, generated kernels in Triton's "
                   "interpreter; not GPU time and not a benchmark")


def profile_callable(fn: Callable[[], Any], reps: int = 30, device: str | torch.device = "cuda",
                     source: str = "peer") -> Profile:
    """The kernels `reps` calls of `fn` launch (a PyTorch peer), grouped by kind; no plan attribution.

    A CUDA-graph peer (torch.compile's reduce-overhead) shows its replayed kernels like any other."""
    dev = torch.device(device)
    with torch.no_grad():
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        wall = _wall_us(fn, reps, dev)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(reps):
                with record_function("call"):
                    fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
    busy = spans = 0.0
    if dev.type == "cuda":
        events = _device_events(prof)
        spans = sum(e.time_range.elapsed_us() for e in events) / reps
        rows = [(None, e.name, us / reps, 1 / reps) for e, us in zip(events, exposed_us(events))]
        busy = busy_us(events) / reps
        note = f"GPU time per call over {reps} calls"
    else:
        calls = [e for e in prof.events() if e.name == "call" and e.device_type == DeviceType.CPU]
        rows = [(None, name, us / reps, 1 / reps) for e in calls for name, _, us in _split_range(e, None)]
        note = "CPU profile: host time of each call's ops; not GPU time and not a benchmark"
    kernels = _kernel_times(rows)
    return Profile(source, dev.type, reps, wall, sum(k.us for k in kernels), _by_kind(kernels), kernels,
                   note=note, busy_us=busy, span_us=spans)


# ATen's generic launchers: a kernel named after one is named by the functor inside it instead.
_ATEN_GENERIC = re.compile(r"elementwise_kernel$|^gpu_kernel_impl|^multi_tensor_apply_kernel$|^TensorListMetadata$"
                           r"|OpFunctor$|^detail$")


def short_name(name: str, width: int = 64) -> str:
    """A kernel name for a table: no `void` or template arguments; ATen's launchers show their functor
    (elementwise_kernel<direct_copy_kernel_cuda>)."""
    s = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    base = re.split(r"[<(]", s, maxsplit=1)[0].strip() or s
    functor = next((f for f in re.findall(r"at::native::(\w+)", s) if not _ATEN_GENERIC.search(f)), None)
    if functor and functor not in base:
        base = f"{base.rsplit('::', 1)[-1]}<{functor}>"
    return base if len(base) <= width else base[:width - 2] + ".."


def format_profile(p: Profile, top: int = 15) -> str:
    """A short text table: totals by kind, the top kernels, the most expensive plan kernels."""
    unit = "GPU" if p.device == "cuda" else "host"
    lines = [f"{p.source} on {p.device}: {p.reps} call(s); {p.note}"]
    if p.device != "cuda":
        lines.append("  (a CPU/interpreter profile: where host time goes, not how fast it runs on a GPU)")
    spans = f" (spans summed {p.span_us:.1f}: kernels overlap)" if p.device == "cuda" and p.span_us > 1.01 * p.total_us else ""
    lines.append(f"  wall {p.wall_us:.1f} us per call, {unit} {p.total_us:.1f} us per call{spans}")
    shares = {k: f"{100 * us / p.total_us:.0f}%" if p.total_us > 0 else "-" for k, us in p.by_kind.items()}
    lines.append("  by kind: " + ", ".join(f"{k} {us:.1f} us ({shares[k]})" for k, us in p.by_kind.items() if us))
    lines.append(f"  layout copies {p.layout_copy_us:.1f} us, misaligned GEMMs (align1/align2) "
                 f"{p.misaligned_gemm_us:.1f} us" + (f", unattributed {p.unattributed_us:.1f} us" if p.plan else ""))
    lines.append(f"  top kernels ({unit} us per call):")
    lines.append(f"    {'us':>9} {'calls':>6}  {'kind':<13} {'plan kernel':<28} kernel")
    for k in p.top(top):
        lines.append(f"    {k.us:>9.1f} {k.calls:>6.1f}  {k.kind:<13} {(k.plan_kernel or '-')[:28]:<28} "
                     f"{short_name(k.name)}{' [misaligned]' if k.misaligned else ''}")
    if p.plan:
        lines.append(f"  plan kernels, most expensive first ({len(p.plan)}):")
        for r in sorted(p.plan, key=lambda r: -r.us)[:top]:
            kinds = ", ".join(f"{k} {us:.1f}" for k, us in r.by_kind.items())
            lines.append(f"    {r.us:>9.1f}  {r.name[:40]:<40} {r.backend:<7} {kinds}")
    return "\n".join(lines)
