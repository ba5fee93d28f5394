"""Reading an ONNX model into an unfolded operator graph, with structural checks.

Every problem is reported as a `TesseraError` naming the file, node or tensor.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from tessera.errors import MalformedModelError, ModelLoadError, ShapeError, UnsupportedError, node_ref
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, GraphKind, Node, TensorType, unique_name

ModelSource = "str | os.PathLike[str] | onnx.ModelProto | bytes"


def read_model(source: Any) -> tuple[onnx.ModelProto, str]:
    """Load a model from a path, bytes or a ModelProto; return it and a label for messages."""
    if isinstance(source, onnx.ModelProto):
        return source, source.graph.name or "<model>"
    if isinstance(source, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(source)), "<bytes>"
        except (DecodeError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"<bytes>: not a valid ONNX model ({e})") from None
    path = Path(os.fspath(source))
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise ModelLoadError(f"{path}: not a valid ONNX model; the file is truncated or corrupt ({e})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{path}: not a valid ONNX model; it has no graph (an empty or non-ONNX file?)")
    return model, str(path)


def check_model(model: onnx.ModelProto, label: str, checker: bool = True, source: Any = None) -> onnx.ModelProto:
    """Inline local functions, then run the ONNX checker; raise MalformedModelError. onnx's checker
    reads serialized bytes: `source`, the file or bytes `model` was read from, spares serializing
    it again (GPT-2: 1.0 s from the file against 2.3 s from the message). `checker=False` leaves the
    checker out for models tessera wrote itself (the PyTorch frontend's), keeping the structural
    checks."""
    if model.functions or not isinstance(source, (str, os.PathLike, bytes)):
        source = None  # inlining changes the model: check what is compiled
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    _check_structure(model.graph, label)
    newest = onnx.defs.onnx_opset_version()
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx") and op.version > newest:
            raise UnsupportedError(f"{label}: opset {op.version} is newer than the newest this onnx knows "
                                   f"({newest}); export the model at opset {newest} or lower")
    try:
        if checker:
            onnx.checker.check_model(model if source is None else source)
    except onnx.checker.ValidationError as e:
        msg = " ".join(str(e).split())
        raise MalformedModelError(f"{label}: {msg}") from None
    return model


def _check_structure(g: onnx.GraphProto, label: str) -> None:
    """Dangling tensors and cycles, named by node, before the checker's terser messages."""
    available = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    produced: dict[str, onnx.NodeProto] = {}
    for n in g.node:
        for o in n.output:
            if o:
                produced[o] = n
    for n in g.node:
        for i in n.input:
            if i not in available and i not in produced:
                raise MalformedModelError(
                    f"{label}: {node_ref(n.name, n.op_type)} reads tensor '{i}', "
                    "which no node, graph input or initializer produces")
    if not g.output:
        raise MalformedModelError(f"{label}: the graph has no outputs, so there is nothing to compute")
    names = [o.name for o in g.output]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise MalformedModelError(f"{label}: graph output(s) {twice} are listed more than once")
    for o in g.output:
        if o.name not in available and o.name not in produced:
            raise MalformedModelError(f"{label}: graph output '{o.name}' is never produced")
    # Cycle check by DFS over producers.
    state: dict[str, int] = {}
    for root in g.node:
        stack = [(root, iter(root.input))]
        if state.get(root.name or id(root)):
            continue
        state[root.name or id(root)] = 1
        while stack:
            node, it = stack[-1]
            for t in it:
                p = produced.get(t)
                if p is None:
                    continue
                key = p.name or id(p)
                if state.get(key) == 1:
                    raise MalformedModelError(
                        f"{label}: the graph has a cycle: {node_ref(node.name, node.op_type)} reads '{t}', "
                        f"which {node_ref(p.name, p.op_type)} writes from its own result")
                if key not in state:
                    state[key] = 1
                    stack.append((p, iter(p.input)))
                    break
            else:
                state[node.name or id(node)] = 2
                stack.pop()


def attr_value(a: onnx.AttributeProto) -> Any:
    """A Python value for an ONNX attribute: str for strings, ndarray for tensors."""
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8") for x in v]
    if isinstance(v, list) and v and isinstance(v[0], onnx.TensorProto):
        return [numpy_helper.to_array(x) for x in v]
    return v


def value_type(vi: onnx.ValueInfoProto, label: str, what: str) -> tuple[list[int | str | None], DType]:
    """Shape (ints, symbolic names or None) and dtype of a ValueInfoProto."""
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise UnsupportedError(f"{label}: {what} '{vi.name}' is not a tensor (sequences and maps are not supported)")
    try:
        dtype = DType.from_onnx(tt.elem_type)
    except ValueError as e:
        raise UnsupportedError(f"{label}: {what} '{vi.name}': {e}") from None
    if not tt.HasField("shape"):
        return [None], dtype  # unknown rank
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims, dtype


def static_input_type(vi: onnx.ValueInfoProto, override: Sequence[int] | None, label: str) -> TensorType:
    """A graph input's static type: its declared shape, or the user's override."""
    dims, dtype = value_type(vi, label, "graph input")
    if override is not None:
        if dims != [None] and len(dims) != len(override):
            raise ShapeError(f"{label}: --input-shape for '{vi.name}' has rank {len(override)}, "
                             f"but the model declares rank {len(dims)} ({_fmt_dims(dims)})")
        clash = [(i, d, int(o)) for i, (d, o) in enumerate(zip(dims, override)) if isinstance(d, int) and d != int(o)]
        if clash:
            i, d, o = clash[0]
            raise ShapeError(f"{label}: --input-shape {vi.name} gives {o} at axis {i}, where the model fixes "
                             f"{d} ({_fmt_dims(dims)}); only symbolic dims can be set")
        if any(int(o) <= 0 for o in override):
            raise ShapeError(f"{label}: --input-shape {vi.name}: every dim must be at least 1, not "
                             f"{'x'.join(map(str, override))}")
        return TensorType(tuple(int(d) for d in override), dtype)
    if dims == [None]:
        raise ShapeError(f"{label}: graph input '{vi.name}' has no shape; pass --input-shape {vi.name}=DIMS")
    bad = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
    if bad:
        i, d = bad[0]
        sym = f"symbolic dim '{d}'" if d else "an unknown dim"
        example = "x".join(str(x) if isinstance(x, int) else "N" for x in dims)
        raise ShapeError(f"{label}: graph input '{vi.name}' has {sym} at axis {i} ({_fmt_dims(dims)}); "
                         f"give it a size with --input-shape {vi.name}={example}")
    return TensorType(tuple(int(d) for d in dims), dtype)


def _fmt_dims(dims: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def constant_node_value(n: onnx.NodeProto, label: str) -> np.ndarray:
    """The value of an ONNX Constant node."""
    for a in n.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name in ("value_float", "value_int"):
            return np.array(helper.get_attribute_value(a), dtype=np.float32 if a.name == "value_float" else np.int64)
        if a.name in ("value_floats", "value_ints"):
            return np.array(list(helper.get_attribute_value(a)),
                            dtype=np.float32 if a.name == "value_floats" else np.int64)
    raise UnsupportedError(f"{label}: {node_ref(n.name, n.op_type)} holds a value kind tessera does not support")


def to_operator_graph(model: onnx.ModelProto, label: str,
                      input_shapes: Mapping[str, Sequence[int]] | None) -> tuple[Graph, dict[str, list]]:
    """The model's graph as an operator Graph with typed inputs and constants,
    node types still unknown. Also returns the declared shapes of other tensors."""
    g = model.graph
    init_names = {t.name for t in g.initializer}
    real_inputs = [i for i in g.input if i.name not in init_names]
    overrides = dict(input_shapes or {})
    unknown = set(overrides) - {i.name for i in real_inputs}
    if unknown:
        raise ShapeError(f"{label}: --input-shape names {sorted(unknown)}, but the graph inputs are "
                         f"{[i.name for i in real_inputs]}")
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in model.opset_import}
    graph = Graph(name=g.name or Path(label).stem, kind=GraphKind.OPERATOR, opsets=opsets)
    for vi in real_inputs:
        graph.inputs.append(vi.name)
        graph.types[vi.name] = static_input_type(vi, overrides.get(vi.name), label)
    for t in g.initializer:
        try:
            arr = numpy_helper.to_array(t)
            dt = DType.from_onnx(t.data_type)
        except (ValueError, TypeError) as e:
            raise UnsupportedError(f"{label}: initializer '{t.name}': {e}") from None
        graph.constants[t.name] = arr
        graph.types[t.name] = TensorType(tuple(int(d) for d in arr.shape), dt)
    taken: set[str] = set()
    for i, n in enumerate(g.node):
        name = unique_name(n.name or f"{n.op_type}_{i}", taken)
        taken.add(name)
        domain = "" if n.domain == "ai.onnx" else n.domain
        if n.op_type == "Constant" and domain == "":
            arr = constant_node_value(n, label)
            graph.constants[n.output[0]] = arr
            graph.types[n.output[0]] = TensorType(tuple(int(d) for d in arr.shape), DType.from_numpy(arr.dtype))
            continue
        attrs = {a.name: attr_value(a) for a in n.attribute}
        graph.nodes.append(Node(name=name, op=n.op_type, inputs=tuple(n.input), outputs=tuple(n.output),
                                attrs=attrs, domain=domain, source=(name,)))
    graph.outputs = [o.name for o in g.output]
    declared = {}
    for vi in list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            declared[vi.name] = value_type(vi, label, "tensor")[0]
    return graph, declared
