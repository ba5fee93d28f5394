"""Semantics-preserving (or, for precision, precision-changing) primitive graph rewrites."""
from tessera.rewrite.precision import PRECISIONS, convert_precision

__all__ = ["PRECISIONS", "convert_precision"]
