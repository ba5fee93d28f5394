"""Stage `fission`: operator graph -> primitive graph."""
from tessera.fission.lower import FissionResult, OpaqueOp, emit_opaque, fission

__all__ = ["FissionResult", "OpaqueOp", "emit_opaque", "fission"]
