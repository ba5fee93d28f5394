"""An executable plan: the chosen kernels, launched in plan order.

Each plan kernel becomes one step (`codegen/select.py` picks the backend):
a generated Triton kernel, a torch linear call (with bias and ReLU inside the
library call where it can take them) plus a generated epilogue, a GEMM
template (a matmul and its epilogue in one generated kernel), a view for
reshapes, or torch for an opaque primitive. Tensors that generated kernels write live in
buffers allocated once and reused by lifetime (`runtime/buffers.py`). On the
GPU the whole sequence is captured once as a CUDA graph and replayed (as one graph per run of
GPU steps where an opaque primitive must run on the host between them); on the
CPU the same kernels run through Triton's interpreter.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from tessera.codegen.kernels import schedule_from_json
from tessera.codegen.launch import KernelCompileError, TritonKernel, pdl_supported, use_interpreter
from tessera.codegen.select import KernelImpl, bias_axis, implement
from tessera.codegen.triton_ops import Unsupported
from tessera.errors import ShapeError, TesseraError, gpu_fault
from tessera.ir.graph import Graph, Node
from tessera.ir.indices import check_feeds, check_range_now, index_bounds
from tessera.ir.prims import Prim
from tessera.runtime.buffers import BufferPool, Lifetime, as_layout, device_constant, round_tf32, stored_constant
from tessera.runtime.concat_alias import concat_aliases
from tessera.log import logger
from tessera.runtime.graphs import CaptureError, capture, capture_mode_strict, raw_stream
from tessera.runtime.index_check import check_in_graph
from tessera.runtime.torch_prims import TORCH_DTYPES, pointwise_conv_as_gemm, run_linear_fused, run_node


class KernelBuildError(TesseraError):
    """A plan kernel could not be generated or compiled; names the kernel and its primitives."""


class KernelFaultError(TesseraError):
    """A plan kernel faulted the GPU on its first run (the capture's warm-up); names the kernel
    (`kernel`) and its schedule."""

    def __init__(self, message: str, kernel: str) -> None:
        super().__init__(message)
        self.kernel = kernel


def _listed(names: Sequence[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@dataclass
class _HostPiece:
    """Steps run on the host between two captured graphs, with the tensors they read (the graph
    before them wrote these) and the static buffers that receive what they compute."""
    steps: list[int]
    reads: dict[str, torch.Tensor]
    statics: dict[str, torch.Tensor]


class _PiecewiseGraph:
    """A plan with host steps, replayed as its captured graphs with the host steps between them.

    It refers to its executable weakly: the executable holds it, and a cycle between them would
    leave a dropped executable's CUDA graphs to Python's cyclic collector, which may run during
    another capture and fail it (`runtime/graphs.capture_guard`)."""

    def __init__(self, exe: "Executable", pieces: list[torch.cuda.CUDAGraph | _HostPiece]) -> None:
        self.exe, self.pieces = weakref.ref(exe), pieces

    def replay(self) -> None:
        exe = self.exe()
        assert exe is not None, "replayed after its executable was freed"
        for piece in self.pieces:
            if isinstance(piece, _HostPiece):
                env = dict(piece.reads)
                exe._run_steps(piece.steps, env)
                for t, buf in piece.statics.items():
                    buf.copy_(env[t])
            else:
                piece.replay()


class PrecisionFlags:
    """A plan's math flags for the libraries (TF32 on or off) and no autograd, restored on leaving.
    A module-level class: one defined per call, closing over its executable, made a cycle that kept
    every dropped executable, and its CUDA graphs, for Python's cyclic collector."""

    def __init__(self, allow_tf32: bool) -> None:
        self.allow_tf32 = allow_tf32

    def __enter__(self) -> None:
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.allow_tf32
        self.cudnn = torch.backends.cudnn.flags(enabled=True, allow_tf32=self.allow_tf32)
        self.cudnn.__enter__()
        self.grad = torch.no_grad()
        self.grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.grad.__exit__(*exc)
        self.cudnn.__exit__(*exc)
        torch.backends.cuda.matmul.allow_tf32 = self.saved


@dataclass
class Step:
    impl: KernelImpl
    kernel: TritonKernel | None
    args: list[str] | None = None  # the kernel's input tensors by name, where they differ from its inputs


def pdl_modes(steps: Sequence[Step]) -> list[int]:
    """Each step's launch under programmatic dependent launch: 0 for a step without a generated kernel;
    for a generated kernel 1 (the next kernel may launch while it runs), or 2 where the next step that
    runs on the GPU (the plan's first after its last: the next call's, as the tuning's timing graph
    launches a candidate) is a kernel whose schedule launches late (`ChainSchedule.late`), which then
    launches only as this one ends. A late schedule was timed so, after itself."""
    runs = [i for i, st in enumerate(steps) if st.impl.backend != "view"]
    modes = [0] * len(steps)
    for j, i in enumerate(runs):
        if steps[i].kernel is not None:
            nxt = steps[runs[(j + 1) % len(runs)]].kernel
            modes[i] = 2 if nxt is not None and getattr(nxt.ks.schedule, "late", False) else 1
    return modes


def own_bias(impl: KernelImpl) -> bool:
    """Whether the bias add of the library call `impl` is its product's own ONNX node's (a Gemm's C, a
    Conv's B: `Node.same_source`), which onnxruntime adds before the product rounds, as
    `orchestrate/candidates.bias_groups` keeps it; an Add node after a MatMul is not."""
    assert impl.linear is not None
    add = next((n for n in impl.fused if n.op == Prim.ADD.value), None)
    return add is not None and impl.linear.same_source(add)


class Executable:
    """Runs a primitive graph kernel by kernel, as a plan orders it."""

    def __init__(self, graph: Graph, plan: Mapping[str, Any], device: str | torch.device = "cpu",
                 cuda_graph: bool = True, kernel_dir: Any = None) -> None:
        self.graph = graph
        self.plan = plan
        self.device = torch.device(device)
        use_interpreter(self.device)
        by_name = {n.name: n for n in graph.nodes}
        self.constants = {name: device_constant(v, self.device, TORCH_DTYPES[graph.types[name].dtype])
                          for name, v in graph.constants.items()}
        self.steps: list[Step] = []
        for k in plan["kernels"]:
            prims = [by_name[n] for n in k["prims"]]
            prologue = [by_name[n] for n in k["prologue"]]
            try:
                sched = schedule_from_json(k["schedule"]) if "schedule" in k else None
                impl = implement(graph, prims, prologue, k["outputs"], k["name"], k.get("source_nodes", ()), sched,
                                 plan.get("precision", "fp32"))
                kernel = TritonKernel(impl.triton, kernel_dir) if impl.triton else None
            except (Unsupported, KernelCompileError) as e:
                raise KernelBuildError(f"kernel {k['name']} ({', '.join(k['prims'])}) cannot be built: {e}") from None
            self.steps.append(Step(impl, kernel))
        self.pdl = pdl_supported(self.device)  # each generated kernel lets the next launch while it runs
        for st, mode in zip(self.steps, pdl_modes(self.steps)):
            if st.kernel is not None:
                st.kernel.pdl = mode if self.pdl else 0
        self._fold_torch_prologues()
        self._stored_constants()
        # Bias vectors the library calls take (constant-derived, computed once); zero-padded to the
        # call's channels (columns) where the layout pass padded them (`KernelImpl.cut`).
        self._bias = {s.impl.name: self._padded_bias(s.impl, self.constants[s.impl.bias])
                      for s in self.steps if s.impl.bias in self.constants}
        # The library calls whose bias is their product's own node's, added before the product rounds
        self._own_bias = {s.impl.name for s in self.steps
                          if s.impl.linear is not None and s.impl.bias and own_bias(s.impl)}
        # Constant weights of convolutions whose input is stored channels-last take the same
        # layout once, here, so cuDNN runs its NHWC kernels with no conversion per call. Generated
        # kernels (a convolution template among them) address a weight by its type's layout, so
        # one that any of them reads as stored keeps it (a template reading its own copy does not).
        generated = {t for st in self.steps if st.kernel is not None for t in st.args or st.kernel.ks.inputs}
        for st in self.steps:
            root = st.impl.linear
            if root is not None and root.op == "conv" and root.inputs[1] in self.constants \
                    and root.inputs[1] not in generated \
                    and graph.types[root.inputs[0]].rank == 4 and not graph.types[root.inputs[0]].plain:
                w = self.constants[root.inputs[1]]
                self.constants[root.inputs[1]] = w.contiguous(memory_format=torch.channels_last)
        # An fp32 plan means fp32 arithmetic: torch would run convs and matmuls in tf32 on Ampere+.
        self.allow_tf32 = plan.get("precision") == "tf32"
        self._plan_memory()
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        if self.cuda_graph:
            capture_mode_strict()  # a TESSERA_CAPTURE it cannot read is an error now, not at a failed capture
        self._graph: torch.cuda.CUDAGraph | _PiecewiseGraph | None = None
        # Why the plan runs launch by launch although it was to be replayed as a CUDA graph: its
        # capture failed (`_capture_or_launch`); None while it is captured or never was.
        self.capture_error: str | None = None
        # Calls share the plan's buffers (and on a GPU its captured graph): one at a time (`exclusive`).
        self._lock = threading.RLock()
        self._last_stream: torch.cuda.Stream | None = None
        self._last_raw: int | None = None  # `_last_stream`'s handle
        # the executable's GPU: its buffers stay there whichever device is current at a later call
        self._cuda_index = (self.device.index if self.device.index is not None else torch.cuda.current_device()) \
            if self.device.type == "cuda" else None
        self._static_in: dict[str, torch.Tensor] = {}
        self._static_out: dict[str, torch.Tensor] = {}
        # When set, each step runs inside `torch.profiler.record_function(<plan kernel name>)`, so a
        # profile can attribute every CUDA kernel to the plan kernel that launched it (runtime/profile).
        self.annotate = False
        self._index_bounds: dict[str, int] | None = None

    def _stored_constants(self) -> None:
        """Constants a kernel reads in another form: in another storage order
        (`KernelSource.input_layouts`, a convolution template's weight) or rounded to tf32
        (`rounded_inputs`, a tf32 template's constant operand). Each form is a copy made once,
        under its own name; an original that no step reads any more is dropped, so a weight is
        held once."""
        copied: set[str] = set()
        for step in self.steps:
            ks = step.kernel.ks if step.kernel is not None else None
            if ks is None or not (ks.input_layouts or ks.rounded_inputs):
                continue
            args = []
            for t in ks.inputs:
                lay, tf32 = ks.input_layouts.get(t), t in ks.rounded_inputs
                if lay is None and not tf32:
                    args.append(t)
                    continue
                key = t + (f"@{''.join(map(str, lay))}" if lay is not None else "") + ("@tf32" if tf32 else "")
                if key not in self.constants:
                    self.constants[key] = stored_constant(self.constants[t], lay, tf32)
                args.append(key)
                copied.add(t)
            step.args = args
        read = set(self.graph.outputs)
        for step in self.steps:
            if step.kernel is not None and step.impl.backend != "linear":
                read.update(step.args or step.kernel.ks.inputs)
            else:
                read.update(self.reads(step))
        for t in copied - read:
            del self.constants[t]

    def _fold_torch_prologues(self) -> None:
        """Free nodes that torch steps read depend only on constants: compute them once, now."""
        for step in self.steps:
            for n in step.impl.folded:
                if all(o in self.constants for o in n.outputs if o):
                    continue
                args = [self.constants[t] for t in n.inputs if t]
                outs = run_node(n, args, [self.graph.types[o] for o in n.outputs if o], device=self.device,
                                opsets=self.graph.opsets)
                self.constants.update(zip([o for o in n.outputs if o], outs))

    def _plan_memory(self) -> None:
        """Buffers for what generated kernels write; what to drop after each step.

        A view step's outputs alias its input, so reading them reads the buffer beneath, and the
        inputs of a concatenation that copies nothing are pieces of its output's buffer
        (`runtime/concat_alias.py`).
        """
        outputs = set(self.graph.outputs)
        alias: dict[str, str] = {}
        for step in self.steps:
            if step.impl.backend == "view":
                for n in step.impl.prims:
                    alias[n.outputs[0]] = alias.get(n.inputs[0], n.inputs[0])
        end = len(self.steps)
        last_read: dict[str, int] = {}
        base_last: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for t in self.reads(step):
                last_read[t] = i
                base_last[alias.get(t, t)] = i
        for t in outputs:
            base_last[alias.get(t, t)] = end
        # A concatenation whose producers write its pieces in place: its output's buffer lives from
        # the first piece's write to the last read of it or of any piece.
        pieces = concat_aliases(self.graph, self.steps, alias, {alias.get(t, t) for t in outputs})
        self.in_place = {self.steps[p.step].impl.name for p in pieces.values()}
        span: dict[str, tuple[int, int]] = {}
        for t, p in pieces.items():
            first, last = span.get(p.concat, (p.writer, p.writer))
            span[p.concat] = (min(first, p.writer), max(last, base_last.get(t, p.writer)))
        lifetimes = []
        for i, step in enumerate(self.steps):
            if step.kernel is None:
                continue
            for t in step.kernel.ks.outputs:
                if t in pieces:
                    continue
                nbytes = self.graph.types[t].nbytes
                first, last = span.get(t, (i, i))
                lifetimes.append(Lifetime(t, nbytes, min(i, first),
                                          end if t in outputs else max(base_last.get(t, i), last)))
        types = {t: self.graph.types[t] for t in (lt.tensor for lt in lifetimes)}
        self.pool = BufferPool(lifetimes, types, self.device)
        for t, p in pieces.items():
            ty = self.graph.types[t]
            self.pool.views[t] = self.pool.views[p.concat].reshape(-1).narrow(0, p.offset, ty.numel).view(ty.shape)
        # Per step, the tensors no later step reads: dropped from the environment after it.
        self.free_after: list[list[str]] = [[] for _ in self.steps]
        for t, i in last_read.items():
            if t not in outputs and t not in self.constants:
                self.free_after[i].append(t)

    def reads(self, step: Step) -> list[str]:
        """The tensors `step` reads from the environment (its nodes' inputs it does not compute)."""
        produced = {o for n in step.impl.nodes for o in n.outputs}
        return [t for n in step.impl.nodes for t in n.inputs if t and t not in produced]

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def backends(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.steps:
            out[s.impl.backend] = out.get(s.impl.backend, 0) + 1
        return out

    def sources(self) -> dict[str, str]:
        """Generated Triton source by kernel name."""
        return {s.impl.name: s.impl.triton.source for s in self.steps if s.impl.triton}

    def prepare_inputs(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Inputs given by position or by name, checked against the model (names, shapes, kinds,
        the index ranges its gathers imply) and placed on the device in the model's dtypes: what
        `run_static` takes, so a benchmark converts its inputs once, outside the timed calls."""
        return self._device_inputs(args, kwargs, convert=True)

    def _device_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any], convert: bool) -> dict[str, torch.Tensor]:
        """`prepare_inputs`; with `convert` off, each input stays in its own dtype and strides (on
        the device), for a caller whose copy into the captured graph's buffers converts it."""
        if args and kwargs:
            raise TypeError("pass inputs by position or by name, not both")
        named = dict(zip(self.graph.inputs, args)) if args else dict(kwargs)
        if len(args) > len(self.graph.inputs) or set(named) != set(self.graph.inputs):
            raise ShapeError(f"the model takes inputs {self.graph.inputs}, got {list(named) or len(args)}")
        # Kinds and index ranges, as onnxruntime checks them (a GPU gather would read past the end);
        # a GPU tensor's ranges are checked by the CUDA graph, on its own input buffers.
        check_feeds(self.graph, {k: v if isinstance(v, (torch.Tensor, np.ndarray)) else np.asarray(v)
                                 for k, v in named.items()}, self._bounds(), device_checked=self.cuda_graph)
        feeds = {}
        for name, v in named.items():
            t = self.graph.types[name]
            x = torch.as_tensor(v).to(self.device)
            if tuple(x.shape) != t.shape:
                raise ShapeError(f"input '{name}' has shape {list(x.shape)}, the model takes {list(t.shape)}")
            feeds[name] = x.to(TORCH_DTYPES[t.dtype]).contiguous() if convert else x
        return feeds

    def inputs_bound(self, feeds: Mapping[str, torch.Tensor]) -> bool:
        """Whether `feeds` are the captured graph's own input buffers (`bind_inputs`), so that
        `run_static` copies nothing before its replay."""
        own = getattr(self, "_static_in", None) or {}
        return self._graph is not None and all(own.get(k) is v for k, v in feeds.items())

    def launch_index_checks(self, feeds: Mapping[str, torch.Tensor]) -> None:
        """Launch the device-side range check of each index input in `feeds` (what the head of the
        captured graph runs on every replay; `runtime/index_check.py`)."""
        for name, n in self._bounds().items():
            check_in_graph(feeds[name], n, name)

    def _bounds(self) -> dict[str, int]:
        """The index inputs and the sizes they gather from."""
        if self._index_bounds is None:  # walks the graph: once, not per call (0.5 ms for GPT-2)
            self._index_bounds = index_bounds(self.graph)
        return self._index_bounds

    def run(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Outputs by name (fresh tensors), for inputs given by position or by name. Safe to call
        from several threads (`exclusive`)."""
        with self.exclusive():
            # Once captured, the copy into the graph's input buffers converts dtype and layout itself:
            # converting first would launch a second kernel per input on every call (an fp32 image
            # into an fp16 plan: two launches and a round trip of the image).
            captured = self.cuda_graph and self._graph is not None
            feeds = self._device_inputs(args, kwargs, convert=not captured)
            return {t: v.clone() for t, v in self.run_static(feeds).items()}

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Inside, no other thread runs this executable: every call writes the same buffers (the
        intermediate tensors, a captured graph's inputs and outputs), so a caller that reads them
        (`run_static`'s outputs) holds this until it has copied what it keeps. On a GPU, a caller on
        another CUDA stream than the one before it first waits, on the GPU, for that caller's work:
        its stream's copies out of the buffers may not have run yet when the lock passes."""
        with self._lock:
            if self._cuda_index is not None:
                # The raw handle is cheap to read; `current_stream` makes a Stream object, 5-9 µs of host
                # time a call on the H200 machine (session 50, call 3), so it runs only on a change.
                raw = raw_stream(self._cuda_index)
                if raw != self._last_raw:
                    stream = torch.cuda.current_stream(self._cuda_index)
                    if self._last_stream is not None:
                        stream.wait_stream(self._last_stream)
                    self._last_stream, self._last_raw = stream, raw
            yield

    def bind_inputs(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The executable's own input buffers, holding `feeds` (from `prepare_inputs`): a caller that
        writes its next inputs into them and passes them to `run_static` saves the copy into the
        captured graph's inputs (one device copy per input and call; IO binding, as TensorRT and
        onnxruntime offer it). Without CUDA graphs there is nothing to bind: `feeds` come back."""
        if not self.cuda_graph:
            return dict(feeds)
        with self.precision_flags():
            if self._graph is None and not self._capture_or_launch(feeds):
                return dict(feeds)
        for name, x in feeds.items():
            if self._static_in[name] is not x:
                self._static_in[name].copy_(x)
        return dict(self._static_in)

    def run_static(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Outputs in the executable's own buffers, overwritten by the next call (for benchmarks).
        Inputs are copied into the captured graph's buffers, unless they are those buffers
        (`bind_inputs`). Not guarded against other threads: a threaded caller holds `exclusive`
        until it has read the outputs, as `run` does."""
        if not self.cuda_graph:
            use_interpreter(self.device)  # a GPU executable built or run since this one was made switched it
            with self.precision_flags():
                return self._launch(feeds)
        if self._graph is None:
            use_interpreter(self.device)
            with self.precision_flags():
                if not self._capture_or_launch(feeds):
                    return self._launch(feeds)
        with torch.no_grad():  # a caller's tensor that requires grad must not make ours require it
            for name, x in feeds.items():
                if self._static_in[name] is not x:
                    self._static_in[name].copy_(x)
        assert self._graph is not None
        if isinstance(self._graph, _PiecewiseGraph):  # its host steps run torch ops: the plan's flags
            with self.precision_flags():
                self._graph.replay()
        else:
            # A CUDA graph's replay needs none of torch's math flags (it holds the launches they
            # chose): setting and restoring them took tens of µs of host time per call.
            self._graph.replay()
        return self._static_out

    def _capture_or_launch(self, feeds: Mapping[str, torch.Tensor]) -> bool:
        """Capture the plan as CUDA graphs; True when it is captured. Where the capture fails (work
        that CUDA forbids while a stream captures, from this thread or from another thread's
        capture-unaware code), the plan runs launch by launch from now on, slower per call but with
        the same kernels and results, and says so once; with TESSERA_CAPTURE=strict the failure is
        an error instead (the fuzzer's and the tests' setting: a fallback would hide a bug)."""
        try:
            self._capture(feeds)
            return True
        except CaptureError as e:
            if capture_mode_strict():
                raise
            self.cuda_graph, self._graph, self._static_in = False, None, {}
            self.capture_error = str(e)
            logger.warning("%s; running its kernels launch by launch (no CUDA graph)", e)
            return False

    @property
    def replay(self) -> str:
        """How a call runs: "cuda graph", "cuda graphs and host steps", "launches" (never captured:
        the CPU, `cuda_graph=False`, or before the first call) or "launches (capture failed: ...)"."""
        if self.capture_error is not None:
            return f"launches (capture failed: {self.capture_error})"
        if self._graph is None:
            return "launches"
        return "cuda graphs and host steps" if isinstance(self._graph, _PiecewiseGraph) else "cuda graph"

    def _capture(self, feeds: Mapping[str, torch.Tensor]) -> None:
        self._static_in = {k: v.clone() for k, v in feeds.items()}
        for name, n in self._bounds().items():  # the first call's indices, before anything reads them
            check_range_now(self._static_in[name], n, name)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # Compiles every kernel before capture; synchronizing after each, once, so a fault
            # names its own kernel.
            self._run_steps(range(len(self.steps)), self._feed_env(self._static_in), sync_each=True)
        torch.cuda.current_stream().wait_stream(stream)
        env = self._feed_env(self._static_in)
        pieces: list[torch.cuda.CUDAGraph | _HostPiece] = []
        pool = None
        for host, steps in self._segments():
            if host:
                # Runs on the host (onnxruntime) between graphs: its inputs stay where the graph
                # before it wrote them, and its outputs go to static buffers the graph after it
                # reads; each replay copies fresh results into them.
                reads = {t: env[t] for t in self._reads_of(steps) if t in env}
                before = set(env)
                self._run_steps(steps, env)
                statics = {t: env[t].clone() for t in env if t not in before}
                env.update(statics)
                pieces.append(_HostPiece(steps, reads, statics))
                continue
            g = torch.cuda.CUDAGraph()
            names = [self.steps[i].impl.name for i in steps]
            # The warm-up ran every step: what fails here is the capture itself.
            with capture(g, pool, f"the CUDA-graph capture of {len(names)} kernel(s) ({_listed(names)})"):
                if pool is None:  # the first graph checks the index inputs, before any gather
                    self.launch_index_checks(self._static_in)
                self._run_steps(steps, env)
            pool = g.pool()  # one memory pool, replayed in capture order
            g.replay()  # real values for a host step that follows
            pieces.append(g)
        self._static_out = {t: env[t] for t in self.graph.outputs}
        self._graph = pieces[0] if len(pieces) == 1 and not isinstance(pieces[0], _HostPiece) \
            else _PiecewiseGraph(self, pieces)

    def _segments(self) -> list[tuple[bool, list[int]]]:
        """Step indices in runs: steps that launch GPU work (captured as one CUDA graph per run),
        and steps with an opaque primitive, which run on the host through onnxruntime and so
        cannot be captured."""
        runs: list[tuple[bool, list[int]]] = []
        for i, step in enumerate(self.steps):
            host = any(n.op == Prim.OPAQUE.value for n in step.impl.prims)
            if runs and runs[-1][0] == host:
                runs[-1][1].append(i)
            else:
                runs.append((host, [i]))
        return runs

    def _reads_of(self, steps: Sequence[int]) -> set[str]:
        made: set[str] = set()
        reads: set[str] = set()
        for i in steps:
            reads |= {t for n in self.steps[i].impl.prims for t in n.inputs if t and t not in made}
            made |= {t for n in self.steps[i].impl.prims for t in n.outputs if t}
        return reads

    def precision_flags(self) -> "PrecisionFlags":
        """A context with the plan's math flags (TF32 on or off in the libraries) and no autograd."""
        return PrecisionFlags(self.allow_tf32)

    def _feed_env(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        # Graph inputs are row-major for users; a kernel measured alone may read one in a layout.
        return {**self.constants, **{t: as_layout(v, self.graph.types[t].layout) for t, v in feeds.items()}}

    def _launch(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        env = self._feed_env(feeds)
        self._run_steps(range(len(self.steps)), env)
        return {t: env[t] for t in self.graph.outputs}

    def precompile(self, feeds: Mapping[str, torch.Tensor]) -> None:
        """Compile the plan's generated kernels for inputs shaped as `feeds` without launching
        anything (`TritonKernel.compile_only`; contents unread: empty tensors will do). A kernel
        that reads what an opaque step computes is left to compile at its first launch."""
        env = self._feed_env(feeds)
        for step in self.steps:
            impl = step.impl
            if impl.backend == "view":  # reshapes only: nothing runs on the GPU
                with suppress(KeyError):  # a view of what an opaque step computes
                    self.run_step(step, env)
            if step.kernel is None or impl.name in self.in_place:
                continue
            ks = step.kernel.ks
            names = step.args or ks.inputs
            args = [env[t] if t in env else self.pool.views.get(t) for t in names]
            if any(a is None for a in args):
                continue
            try:
                step.kernel.compile_only(*args, *[self.pool.views[t] for t in ks.outputs])
            except KernelCompileError as e:
                raise KernelBuildError(str(e)) from None

    def _run_steps(self, steps: Sequence[int], env: dict[str, torch.Tensor], sync_each: bool = False) -> None:
        """Run steps in order, freeing what each last reads. `sync_each` synchronizes after each
        step, so a GPU fault is reported by the kernel that made it: CUDA reports a fault at the
        next call into the driver, which is some later kernel's launch."""
        for i in steps:
            step = self.steps[i]
            with torch.profiler.record_function(step.impl.name) if self.annotate else nullcontext():
                if not sync_each:
                    self.run_step(step, env)
                else:
                    try:
                        self.run_step(step, env)
                        if self.device.type == "cuda":
                            torch.cuda.synchronize(self.device)
                    except Exception as e:  # noqa: BLE001 - a fault surfaces as whatever raised it
                        if not gpu_fault(e):
                            raise
                        raise KernelFaultError(self._fault_message(step, e), step.impl.name) from None
            for t in self.free_after[i]:
                env.pop(t, None)

    def _fault_message(self, step: Step, e: Exception) -> str:
        ks = step.kernel.ks if step.kernel is not None else None
        sched = ks.schedule.to_json() if ks is not None and hasattr(ks.schedule, "to_json") else None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (f"kernel {step.impl.name} ({step.impl.backend}"
                + (f", schedule {sched}" if sched else "")
                + f") faulted the GPU on its first run: {first}. This process's CUDA context is lost; "
                "run the model in a new process. A generated kernel that faults is a tessera or Triton "
                "bug: please report it with the artifact's plan.json (scripts/fault_probe.py finds the "
                "kernel and keeps its source).")

    def run_step(self, step: Step, env: dict[str, torch.Tensor]) -> None:
        """Run one plan kernel over `env` (tensors by name), adding its outputs to it."""
        impl = step.impl
        if impl.name in self.in_place:  # its producers wrote its output (runtime/concat_alias.py)
            env[impl.outputs[0]] = self.pool.views[impl.outputs[0]]
            return
        if impl.backend in ("triton", "template"):  # a template launches like any generated kernel
            self._triton(step, env)
        elif impl.backend == "view":
            for n in impl.prims:
                env[n.outputs[0]] = env[n.inputs[0]].reshape(self.graph.types[n.outputs[0]].shape)
        elif impl.backend == "linear":
            self._linear(impl, env)
            if step.kernel is not None:
                self._triton(step, env)
        else:  # a tensor stored rounded to tf32 (Graph.tf32_rounded) is rounded as a kernel would store it
            env.update({t: round_tf32(v) if t in self.graph.tf32_rounded else v
                        for t, v in self._torch(impl.prims, env).items() if t in impl.outputs})

    def _padded_bias(self, impl: KernelImpl, bias: torch.Tensor) -> torch.Tensor:
        """The bias the library call of `impl` takes: a vector, `bias` flat and zero-padded to the
        padded channels (columns) the call computes (a conv's broadcast vector read back as one row
        of channels), or a matmul's whole bias as [rows, columns]."""
        assert impl.linear is not None and impl.bias is not None
        axis = bias_axis(impl.linear) % bias.dim()
        if bias.numel() != bias.shape[axis] and impl.linear.op != Prim.MATMUL.value:
            # a conv's channel vector that another kernel broadcast: its one row of channels, a view
            bias = bias[tuple(slice(None) if d == axis else 0 for d in range(bias.dim()))]
        elif bias.numel() != bias.shape[axis]:
            # a matmul's bias that varies along its rows too: as the sum's [rows, columns], zero-padded
            # to the padded columns where the call computes those (then the cut)
            add = next(n for n in impl.fused if n.op == Prim.ADD.value)
            shape = self.graph.types[add.outputs[0]].shape
            whole = bias.expand(shape).reshape(-1, shape[-1])
            if impl.cut is not None:
                padded = self.graph.types[impl.linear.outputs[0]].shape[-1]
                whole = torch.nn.functional.pad(whole, (0, padded - shape[-1]))
            return whole.contiguous()
        b = bias.reshape(-1)
        if impl.cut is not None:
            axis = bias_axis(impl.linear)
            if b.numel() == 1:
                # One value for every channel (a Gemm's scalar C): one per real channel before the zero
                # padding, which would otherwise leave it on the first channel alone.
                add = next(n for n in impl.fused if n.op == Prim.ADD.value)
                b = b.expand(self.graph.types[add.outputs[0]].shape[axis])
            n = self.graph.types[impl.linear.outputs[0]].shape[axis]
            b = torch.nn.functional.pad(b, (0, n - b.numel()))
        return b.contiguous()

    def _linear(self, impl: KernelImpl, env: dict[str, torch.Tensor]) -> None:
        """The library call of a linear kernel (with the bias and activation it absorbs)."""
        root = impl.linear
        assert root is not None
        view = {n.outputs[0]: n for n in impl.views}  # transposed operands: strided views, no copy
        args = [env[t] if t not in view else env[view[t].inputs[0]].transpose(-1, -2) for t in root.inputs if t]
        bias = None
        if impl.bias:  # a constant bias was flattened (and padded) at load; one computed before, now
            bias = self._bias.get(impl.name)
            bias = self._padded_bias(impl, env[impl.bias]) if bias is None else bias
        gemm = pointwise_conv_as_gemm(root, args, bias, impl.activation) \
            if not self.graph.types[root.outputs[0]].plain else None
        if gemm is not None:
            last = impl.fused[-1].outputs[0] if impl.bias else root.outputs[0]
            env[last] = self._settle(last, self._cut(impl, last, gemm))
        elif impl.bias:
            last = impl.fused[-1].outputs[0]
            out = self.graph.types[last]
            if impl.cut is not None:  # the call computes the padded channels (columns), then the cut
                axis, shape = bias_axis(root), list(out.shape)
                shape[axis] = self.graph.types[root.outputs[0]].shape[axis]
                out = replace(out, shape=tuple(shape))
            assert bias is not None
            y = run_linear_fused(root, args, out, bias, impl.activation, impl.alpha,
                                 impl.name in self._own_bias)
            env[last] = self._settle(last, self._cut(impl, last, y))
        else:
            outs = run_node(root, args, [self.graph.types[o] for o in root.outputs if o], device=self.device,
                            opsets=self.graph.opsets)
            env.update({o: self._settle(o, y) for o, y in zip([o for o in root.outputs if o], outs)})

    def _cut(self, impl: KernelImpl, last: str, y: torch.Tensor) -> torch.Tensor:
        """`y`, the library result of `impl` computed on padded channels (columns), cut back to `last`."""
        if impl.cut is None:
            return y
        assert impl.linear is not None
        axis = bias_axis(impl.linear)
        return y.narrow(axis, 0, self.graph.types[last].shape[axis])

    def _settle(self, t: str, y: torch.Tensor) -> torch.Tensor:
        """`y` in the memory layout the plan gave `t`: generated kernels address it by that layout.
        The library usually returns it so already (cuDNN keeps a channels-last input's layout);
        otherwise this is a copy, which a profile shows as a layout copy."""
        return as_layout(y, self.graph.types[t].layout)

    def _triton(self, step: Step, env: dict[str, torch.Tensor]) -> None:
        assert step.kernel is not None
        ks = step.kernel.ks
        outs = [self.pool.views[t] for t in ks.outputs]
        try:
            step.kernel(*[env[t] for t in step.args or ks.inputs], *outs)
        except KernelCompileError as e:
            raise KernelBuildError(str(e)) from None
        env.update(zip(ks.outputs, outs))

    def _torch(self, nodes: Sequence[Node], env: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        local: dict[str, torch.Tensor] = {}
        for n in nodes:
            ins = [local[t] if t in local else env[t] for t in n.inputs if t]
            outs = run_node(n, ins, [self.graph.types[o] for o in n.outputs if o], device=self.device,
                            opsets=self.graph.opsets)
            # Generated kernels address memory by the planned layout.
            local.update((o, self._settle(o, y)) for o, y in zip([o for o in n.outputs if o], outs))
        return local

    def __call__(self, *args: Any, **kwargs: Any) -> list[torch.Tensor]:
        outs = self.run(*args, **kwargs)
        return [outs[t] for t in self.graph.outputs]
