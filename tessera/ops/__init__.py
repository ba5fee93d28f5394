"""Operator families: ONNX operator semantics and their fission rules.

Importing this package registers every rule.
"""
from tessera.ops import (  # noqa: F401  (registers rules)
    elementwise, layout, linear, normalization, placement, pooling, resize, rotary)
from tessera.ops.registry import OpCtx, OpDef, Unsupported, lookup, register, supported_ops

__all__ = ["OpCtx", "OpDef", "Unsupported", "lookup", "register", "supported_ops"]
