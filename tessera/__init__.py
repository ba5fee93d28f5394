"""tessera: a compiler for deep-learning inference on NVIDIA GPUs.

The public Python API, re-exported from the stages that own it:
`compile` (model -> callable), `load` (artifact directory -> callable),
`compile_model` (model -> plan and the graphs behind it), `verify`,
`summarize`. Stage functions live in their packages (`tessera.frontend.load`
reads an ONNX model into an operator graph).
"""
from tessera.compiler import CompileOptions, CompileResult, compile, compile_model
from tessera.errors import TesseraError
from tessera.fission import fission
from tessera.runtime.buckets import load
from tessera.summary import summarize
from tessera.verify import verify
from tessera.version import __version__

__all__ = ["CompileOptions", "CompileResult", "TesseraError", "compile", "compile_model", "fission", "load",
           "summarize", "verify", "__version__"]
