"""Semantics-preserving (or, for precision, precision-changing) primitive graph rewrites."""
from tessera.rewrite.precision import IO_CHOICES, PRECISIONS, convert_precision, mark_tf32_operands

__all__ = ["IO_CHOICES", "PRECISIONS", "convert_precision", "mark_tf32_operands"]
