"""Stage `fission`: operator graph -> primitive graph."""
from tessera.fission.lower import FissionResult, OpaqueOp, emit_opaque, fission, lower_node

__all__ = ["FissionResult", "OpaqueOp", "emit_opaque", "fission", "lower_node"]
