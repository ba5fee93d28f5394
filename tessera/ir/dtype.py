"""Tensor element types and their NumPy / ONNX spellings."""
from __future__ import annotations

import enum

import numpy as np
from onnx import TensorProto


class DType(enum.Enum):
    """Element types tessera's IR can hold."""

    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT64 = "float64"
    INT64 = "int64"
    INT32 = "int32"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"

    @property
    def is_float(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16, DType.FLOAT64)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def to_numpy(self) -> np.dtype:
        """NumPy has no bfloat16; the reference computes it in float32."""
        if self is DType.BFLOAT16:
            return np.dtype(np.float32)
        return np.dtype(self.value)

    def to_onnx(self) -> int:
        return _TO_ONNX[self]

    @staticmethod
    def from_onnx(code: int) -> "DType":
        try:
            return _FROM_ONNX[code]
        except KeyError:
            name = TensorProto.DataType.Name(code) if code in TensorProto.DataType.values() else str(code)
            raise ValueError(f"unsupported ONNX element type {name}") from None

    @staticmethod
    def from_numpy(dt: np.dtype) -> "DType":
        return DType(np.dtype(dt).name)


_ITEMSIZE = {
    DType.FLOAT32: 4, DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT64: 8,
    DType.INT64: 8, DType.INT32: 4, DType.INT8: 1, DType.UINT8: 1, DType.BOOL: 1,
}
_TO_ONNX = {
    DType.FLOAT32: TensorProto.FLOAT, DType.FLOAT16: TensorProto.FLOAT16,
    DType.BFLOAT16: TensorProto.BFLOAT16, DType.FLOAT64: TensorProto.DOUBLE,
    DType.INT64: TensorProto.INT64, DType.INT32: TensorProto.INT32,
    DType.INT8: TensorProto.INT8, DType.UINT8: TensorProto.UINT8, DType.BOOL: TensorProto.BOOL,
}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}
