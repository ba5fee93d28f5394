"""Shared test setup: `tests/` is on sys.path, so tests import `opcheck` directly."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

# A CUDA-graph capture that fails is an error in the tests, not a quiet fallback to launches
# (`runtime/graphs.py`); tests of the fallback itself set the variable back.
os.environ.setdefault("TESSERA_CAPTURE", "strict")
