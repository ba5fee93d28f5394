"""Shared test setup: `tests/` is on sys.path, so tests import `opcheck` directly."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
