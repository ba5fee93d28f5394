"""PyTorch entry points: `tessera.compile(module, example_inputs)` and `torch.compile(model, backend="tessera")`.

Both go through `frontend/fx.py` (the module or dynamo's FX graph -> core ATen -> the ONNX
operators the op registry splits) and then the same compile as an ONNX model. The backend is
registered under the `torch_dynamo_backends` entry point (pyproject.toml), so
`torch.compile(model, backend="tessera", options={...})` needs no import; the options are
`CompileOptions` fields (precision, cost, gpu, strategy, db, ...).

Dynamo owns graph breaks and guards: each graph it captures compiles on its own, and a call with
the same shapes reuses the compiled plan. Parameters and buffers are frozen into the plan.
"""
from __future__ import annotations

import threading
import time
from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence

import torch

from tessera.compiler import CompileOptions, CompileResult, compile_model, plan_document, rebuild_meta
from tessera.errors import TesseraError, UnsupportedError
from tessera.frontend import load
from tessera.frontend.fx import OnnxFromTorch, aten_graph, fold_static, to_onnx
from tessera.log import logger
from tessera.runtime import plan_cache
from tessera.runtime.artifact import graph_digest
from tessera.runtime.executable import Executable
from tessera.torch_dynamic import BucketedModule, dims_from_spec, dynamo_dims


class CompiledModule:
    """A compiled PyTorch graph: call it like the module (tensors by position). `result` is the
    compile's (plan, graphs, tuning), None when the plan came from the plan cache; `stages` the
    seconds each step of the compile took (trace, onnx, load, plan cache, compile, executable)."""

    def __init__(self, exe: Executable, bridge: OnnxFromTorch, result: CompileResult | None, tuple_out: bool,
                 stages: Mapping[str, float] | None = None) -> None:
        self.exe, self.bridge, self.result, self.tuple_out = exe, bridge, result, tuple_out
        self.stages = dict(stages or {})

    def __call__(self, *args: Any) -> Any:
        ins = [args[i] for i in self.bridge.inputs]
        outs = self.exe(*ins)
        flat = []
        for kind, v in self.bridge.outputs:
            flat.append(outs[v] if kind == "model" else args[v] if kind == "input" else v)
        return tuple(flat) if self.tuple_out else flat[0]


def options_from(options: Mapping[str, Any] | CompileOptions | None) -> CompileOptions:
    """CompileOptions from a dict of its fields (torch.compile's `options`), checked by name."""
    if options is None or isinstance(options, CompileOptions):
        return options or CompileOptions()
    known = {f.name for f in fields(CompileOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TesseraError(f"unknown tessera option(s) {unknown}; the options are {sorted(known)}")
    return CompileOptions(**dict(options))


def compile_module(module: Callable[..., Any], example_inputs: Sequence[Any],
                   options: Mapping[str, Any] | CompileOptions | None = None, name: str | None = None,
                   frozen: set[int] | None = None, dynamic: Mapping[int, Mapping[int, Any]] | None = None) -> Any:
    """Compile an nn.Module (or any traceable function) for inputs like `example_inputs`.

    The plan is built for the example inputs' shapes and dtypes, on their device: a
    `CompiledModule`. A module that does not trace as one graph (Python control flow on tensor
    values) is compiled through `torch.compile(backend=tessera)` instead, one plan per graph that
    dynamo captures. `frozen` names positional inputs that are constants (a dynamo graph's
    parameters). `dynamic` ({arg: {axis: (low, high)}}, `torch_dynamic.dims_from_spec`) compiles
    one plan per shape bucket instead, all of them now: a `BucketedModule`."""
    opt = options_from(options)
    label = name or getattr(type(module), "__name__", "module")
    if isinstance(module, torch.nn.Module) and not isinstance(module, torch.fx.GraphModule) and module.training:
        raise TesseraError(f"{label} is in training mode; tessera compiles inference: call .eval() on it first")
    if dynamic:
        bucketed = BucketedModule(module, dims_from_spec(example_inputs, dynamic), label,
                                  lambda args: compile_module(module, args, opt, name=label, frozen=frozen))
        bucketed.compile_all(example_inputs)
        return bucketed
    stages = _Laps()  # where a (re)compile's time goes
    traced, frozen = module, set(frozen or ())
    if isinstance(module, torch.fx.GraphModule):  # a dynamo graph: sizes and module scalars are fixed here
        static = {i for i, x in enumerate(example_inputs)
                  if not isinstance(x, torch.Tensor) or (x.dim() == 0 and not isinstance(x, torch.nn.Parameter))}
        traced = fold_static(module, example_inputs, static)
        frozen |= static  # constants of this plan, not inputs it copies in at each call
    try:
        gm = aten_graph(traced, list(example_inputs))
    except Exception as e:  # noqa: BLE001 - tracing raises whatever the model's code raises
        if isinstance(module, torch.fx.GraphModule):
            raise TesseraError(f"{label}: tracing to ATen failed: {type(e).__name__}: {e}") from None
        # Python control flow on tensor values (transformers' mask checks): dynamo splits the model
        # into graphs around it, each compiled by the backend.
        logger.info("%s does not trace as one graph (%s); compiling it through torch.compile", label,
                    str(e).splitlines()[0][:200])
        return _through_dynamo(module, example_inputs, opt)
    stages.lap("trace")
    bridge = to_onnx(gm, list(example_inputs), frozen, label)
    if bridge.opaque:
        logger.info("%s: ATen op(s) kept whole (run by torch): %s", label, ", ".join(bridge.opaque))
    stages.lap("onnx")
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")
    tuple_out = bridge.tuple_out
    loaded = load(bridge.model, checker=False)  # the bridge's own output: onnx's checker re-serializes the weights
    stages.lap("load")
    key = None
    if opt.plan_cache:
        key = plan_cache.plan_key(plan_cache.model_digest(bridge.model), opt,
                                  torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
        exe = plan_cache.lookup(key, loaded, device)
        stages.lap("plan cache")
        if exe is not None:
            exe.plan["model"] = loaded.label  # the key leaves the graph's name out: another label may have stored it
            logger.info("%s: plan reused from the plan cache (%s); %s", label, key[:12], _stage_line(stages))
            return CompiledModule(exe, bridge, None, tuple_out, stages)
    result = compile_model(loaded, opt)
    stages.lap("compile")
    exe = Executable(result.graph, plan_document(result), device)
    stages.lap("executable")
    if key is not None:
        meta = {**rebuild_meta(result), "graph_digest": graph_digest(result.graph),
                "layout_choices": result.layouts.choices if result.layouts is not None else []}
        plan_cache.store(key, exe.plan, meta)
    logger.info("%s: compiled; %s", label, _stage_line(stages))
    return CompiledModule(exe, bridge, result, tuple_out, stages)


class _Laps(dict):
    """Seconds per named step, each timed from the end of the step before."""

    def __init__(self) -> None:
        super().__init__()
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self[name], self._t = now - self._t, now


def _stage_line(stages: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in stages.items())


def dynamo_compile(module: Callable[..., Any], options: CompileOptions,
                   dynamo_options: dict[str, Any] | None = None) -> tuple[Callable[..., Any], list[Any]]:
    """`torch.compile(module, backend=tessera)` with `options`, and the list that each graph dynamo
    captures is compiled into (a CompiledModule, a BucketedModule or a PerShape), filled as calls
    capture them. `dynamo_options` are torch.compile's own (its `guard_filter_fn`)."""
    compiled: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled.append(tessera_backend(gm, example_inputs, options=options))
        return compiled[-1]

    return torch.compile(module, backend=backend, **({"options": dict(dynamo_options)} if dynamo_options else {})), \
        compiled


def _through_dynamo(module: Callable[..., Any], example_inputs: Sequence[Any], opt: CompileOptions) -> Any:
    """torch.compile(module, backend=tessera), compiled now by one call on the example inputs."""
    fn, _ = dynamo_compile(module, opt)
    with torch.no_grad():
        fn(*example_inputs)
    return fn


def _module_state(node: torch.fx.Node) -> bool:
    """Is this dynamo placeholder a parameter or buffer of a module (by where dynamo read it)?"""
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    while src is not None:
        kind = type(src).__name__
        if "ParamBuffer" in kind or kind == "NNModuleSource":
            return True
        src = getattr(src, "base", None)
    return False


class PerShape:
    """A graph dynamo captured with sizes that padding cannot follow (an input of size s0 * 2): one
    plan per shape seen, compiled at its first call (the plan cache makes a shape seen in an
    earlier process cheap). Other dynamic graphs run in buckets (`torch_dynamic.BucketedModule`)."""

    def __init__(self, gm: torch.fx.GraphModule, options: Any, frozen: set[int], name: str) -> None:
        self.gm, self.options, self.frozen, self.name = gm, options, frozen, name
        self.plans: dict[tuple, Callable[..., Any]] = {}
        self._compiling = threading.Lock()  # threads meeting one new shape at once: one compiles it

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args)
        plan = self.plans.get(key)
        if plan is None:
            with self._compiling:
                plan = self.plans.get(key)
                if plan is None:
                    logger.info("%s: a new shape %s; compiling a plan for it", self.name,
                                [k[0] if isinstance(k, tuple) else k for k in key])
                    plan = self.plans[key] = compile_or_eager(self.gm, args, self.options, self.name, self.frozen)
        return plan(*args)


def tessera_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                    options: Mapping[str, Any] | None = None, **_: Any) -> Callable[..., Any]:
    """The dynamo backend: one captured graph -> a callable running tessera's plan."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    frozen = {i for i, (n, x) in enumerate(zip(placeholders, example_inputs))
              if isinstance(x, torch.nn.Parameter) or _module_state(n)}
    name = f"dynamo_graph_{gm.meta.get('dynamo_compile_id', '')}"
    dims = dynamo_dims(gm)  # sizes dynamo made symbolic (automatic dynamic, mark_dynamic, dynamic=True)
    if dims is None:
        return PerShape(gm, options_from(options), frozen, name)
    # 0-d tensors that are not parameters: module floats that dynamic=True passes as inputs (eps,
    # dropout p), baked into each plan (fold_static) and so part of its key
    scalars = [i for i, x in enumerate(example_inputs)
               if isinstance(x, torch.Tensor) and x.dim() == 0 and not isinstance(x, torch.nn.Parameter)]
    if dims or scalars:
        opt = options_from(options)
        return BucketedModule(gm, dims, name, lambda args: compile_or_eager(gm, args, opt, name, frozen), scalars)
    return compile_or_eager(gm, example_inputs, options, name, frozen)


def compile_or_eager(gm: torch.fx.GraphModule, args: Sequence[Any], options: Any, name: str,
                     frozen: set[int]) -> Callable[..., Any]:
    """A dynamo graph's plan; or, where the graph holds what tessera cannot represent (complex
    tensors from an FFT, a non-ATen call), the graph itself, run by PyTorch as dynamo captured it,
    with a warning that says why. The user's torch.compile goes on rather than failing whole."""
    try:
        return compile_module(gm, args, options, name=name, frozen=frozen)
    except UnsupportedError as e:
        logger.warning("%s runs in PyTorch, not tessera: %s", name, e)
        return gm.forward


def register() -> None:
    """Register the backend with dynamo by hand, for a tessera used from a source tree (PYTHONPATH)
    where the `torch_dynamo_backends` entry point of an installed package is missing."""
    from torch._dynamo import list_backends, register_backend

    if "tessera" not in list_backends(exclude_tags=()):
        register_backend(tessera_backend, "tessera")
