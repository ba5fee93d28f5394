"""An ATen operator call kept whole: the fallback of the PyTorch frontend.

The FX frontend (`frontend/fx.py`) writes an ATen op that has no ONNX counterpart as a node of the
custom domain `ATEN_DOMAIN`: its op type is the overload's name (`aten.cumsum.default`) and its
one attribute, `call`, is the call's arguments as JSON, tensors replaced by the node's input
positions. Nothing here runs code from a model file: the op is looked up by name in
`torch.ops.aten` and called with plain values.

Every place that runs an opaque node (the reference interpreter, the runtime, the reference for
`--check`) comes here for this domain, so they agree. Output types travel with the call
(`out_types`), as the frontend computed them.
"""
from __future__ import annotations

import json
import math
from typing import Any, Sequence

import torch

from tessera.errors import UnsupportedError
from tessera.ir.dtype import DType

ATEN_DOMAIN = "ai.tessera.aten"
ATEN_OPSET = 1


def encode(value: Any, tensor_index: Any) -> Any:
    """A JSON-able form of one argument. `tensor_index(x)` gives a tensor argument's input
    position (or None when `x` is not a tensor input)."""
    i = tensor_index(value)
    if i is not None:
        return {"input": i}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return {"list": [encode(v, tensor_index) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": True}  # the device the call runs on
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    raise UnsupportedError(f"an ATen call argument of type {type(value).__name__} cannot be stored")


def _decode(value: Any, inputs: Sequence[torch.Tensor], device: torch.device) -> Any:
    if isinstance(value, dict):
        (kind, v), = value.items()
        if kind == "input":
            return inputs[v]
        if kind == "float":
            return float(v)
        if kind == "list":
            return [_decode(x, inputs, device) for x in v]
        if kind == "device":
            return device
        return getattr(torch, v)  # dtype, layout or memory format: a torch attribute by name
    return value


def dumps(args: Sequence[Any], kwargs: dict[str, Any], tensor_index: Any) -> str:
    """The `call` attribute for `op(*args, **kwargs)`."""
    return json.dumps({"args": [encode(a, tensor_index) for a in args],
                       "kwargs": {k: encode(v, tensor_index) for k, v in kwargs.items()}})


def overload(name: str) -> Any:
    """`torch.ops.aten.<packet>.<overload>` from 'aten.packet.overload', checked."""
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        raise UnsupportedError(f"'{name}' is not an ATen operator overload")
    try:
        return getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except AttributeError:
        raise UnsupportedError(f"this torch has no operator {name}") from None


def run(op_type: str, call: str, inputs: Sequence[torch.Tensor], device: torch.device | None = None
        ) -> list[torch.Tensor]:
    """The outputs of the stored call on `inputs` (a single result is a one-element list)."""
    spec = json.loads(call)
    dev = device if device is not None else (inputs[0].device if inputs else torch.device("cpu"))
    args = [_decode(a, inputs, dev) for a in spec["args"]]
    kwargs = {k: _decode(v, inputs, dev) for k, v in spec["kwargs"].items()}
    out = overload(op_type)(*args, **kwargs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def torch_dtype(dt: DType) -> torch.dtype:
    return getattr(torch, dt.value)

