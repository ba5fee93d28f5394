"""tessera's logger: standard `logging` under the name "tessera".

Nothing is printed unless asked: `tessera -v ...` (passes, partitions, the solver, tuning) or
`-vv` (per-batch detail), or the environment variable TESSERA_LOG=info|debug. Library users
configure it as any logger: `logging.getLogger("tessera").setLevel(logging.INFO)`.
"""
from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("tessera")
ENV = "TESSERA_LOG"


def configure(verbosity: int = 0) -> None:
    """Log to stderr at INFO (1) or DEBUG (2+); 0 leaves the level to TESSERA_LOG (default: quiet)."""
    level = {1: logging.INFO}.get(verbosity, logging.DEBUG) if verbosity > 0 else \
        {"info": logging.INFO, "debug": logging.DEBUG}.get(os.environ.get(ENV, "").lower())
    if level is None:
        return
    ours = [h for h in logger.handlers if getattr(h, "_tessera", False)]
    if ours:
        ours[0].setStream(sys.stderr)  # type: ignore[attr-defined]  # today's stderr, not the first call's
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("tessera %(asctime)s %(message)s", "%H:%M:%S"))
        handler._tessera = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
