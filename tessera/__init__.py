"""tessera: a compiler for deep-learning inference on NVIDIA GPUs.

The public Python API, re-exported from the stages that own it.
"""
from tessera.compiler import CompileOptions, CompileResult, compile_model
from tessera.errors import TesseraError
from tessera.fission import fission
from tessera.frontend import load
from tessera.summary import summarize
from tessera.verify import verify

__version__ = "0.1.0"

__all__ = ["CompileOptions", "CompileResult", "TesseraError", "compile_model", "fission", "load", "summarize",
           "verify", "__version__"]
