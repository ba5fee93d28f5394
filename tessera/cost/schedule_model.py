"""An analytical model that ranks a generated kernel's schedules before any is measured (MCFuser's idea).

A memory-bound kernel's time is its traffic over the bandwidth it reaches,
and a schedule changes three things about that:

- **parallelism**: DRAM bandwidth saturates only with enough busy warps in
  flight per SM (`warps_to_saturate`); few programs, or programs of few
  warps, leave it idle;
- **padding**: lanes past the end of a row or of the grid load nothing (their
  loads are masked) but occupy warps, so they count against parallelism;
- **register pressure**: a block holds `xblock * rblock` values over
  `32 * num_warps` threads; beyond `values_per_thread` they spill
  (`spill_cost` per doubling);

plus a cost per loop iteration for looped reductions, and, for a reduction whose row
elements are apart in memory (NHWC storage reduced over H and W), **coalescing**: a
warp's load is only as wide as the rows a block holds side by side, and DRAM moves
32-byte sectors. The constants are fitted to
H100 measurements of the same kernels under several schedules
(`scripts/schedule_fit.py`), which also reports how well the ranking picks.
Post-scheduling measures the top of the ranking and stops when it converges
(`cost/measured.py`, `tune_schedules`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tessera.codegen.kernels import KernelSource, Schedule, schedules
from tessera.cost.devices import Device, device
from tessera.ir.graph import Graph


@dataclass(frozen=True)
class ScheduleParams:
    warps_to_saturate: float = 24.0  # warps per SM at which a streaming kernel reaches full bandwidth
    values_per_thread: float = 64.0  # register-resident values per thread before spilling
    spill_cost: float = 0.5  # extra time per doubling past values_per_thread
    loop_iteration_s: float = 1.0e-7  # per sequential chunk of a looped reduction (per program wave)
    max_warps_per_sm: int = 64


DEFAULT_PARAMS = ScheduleParams()


SECTOR_BYTES = 32


def predict(s: Schedule, xnumel: int, rnumel: int, nbytes: float, dev: Device,
            p: ScheduleParams = DEFAULT_PARAMS, strided_itemsize: int = 0) -> float:
    """Predicted seconds of one launch under schedule s (only the ranking is meant to be right)."""
    rnumel = max(1, rnumel)
    programs = math.ceil(xnumel / s.xblock)
    pad_x = programs * s.xblock / xnumel
    if rnumel > 1 and not s.persistent:
        chunks = math.ceil(rnumel / s.rblock)
        pad_r = chunks * s.rblock / rnumel
    else:
        chunks = 1
        pad_r = max(s.rblock, 1) / rnumel if rnumel > 1 else 1.0
    warps = min(programs * s.num_warps, dev.sms * p.max_warps_per_sm)
    saturation = min(1.0, warps / (pad_x * pad_r) / (dev.sms * p.warps_to_saturate))
    per_thread = s.xblock * max(s.rblock, 1) / (32 * s.num_warps)
    spill = 1.0 + p.spill_cost * max(0.0, math.log2(per_thread / p.values_per_thread))
    waves = math.ceil(programs * s.num_warps / (dev.sms * p.max_warps_per_sm))
    stream = nbytes / (dev.bandwidth * saturation)
    if strided_itemsize:  # adjacent rows are adjacent in memory: a sector holds that many of them
        stream /= min(1.0, s.xblock * strided_itemsize / SECTOR_BYTES)
    return stream * spill + chunks * waves * p.loop_iteration_s


def rank(space: Sequence[Schedule], xnumel: int, rnumel: int, nbytes: float, dev: Device,
         p: ScheduleParams = DEFAULT_PARAMS, tile: tuple[int, int] | None = None,
         strided_itemsize: int = 0) -> list[Schedule]:
    """The space from most to least promising (ties keep the space's order). A tiled pointwise
    schedule (rblock > 1 in a kernel with `tile`) is priced like a row kernel over (rows, columns);
    the model knows nothing of coalescing, which is what tiling is for."""
    def cost(s: Schedule) -> float:
        if tile is not None and rnumel <= 1 and s.rblock > 1:
            return predict(s, tile[0], tile[1], nbytes, dev, p)
        return predict(s, xnumel, rnumel, nbytes, dev, p, strided_itemsize)

    return sorted(space, key=cost)


def rank_kernel(graph: Graph, ks: KernelSource, dev: Device | None = None) -> tuple[list[Schedule], list[Schedule]]:
    """A generated kernel's schedule space (the default first) and the same space ranked,
    with the kernel's own traffic; `dev` defaults to the H100 preset."""
    # A tiled kernel (xnumel rows of rnumel columns) has the same space as its flat form.
    xnumel, rnumel = (ks.xnumel * ks.rnumel, 1) if ks.tile and ks.schedule.rblock > 1 else (ks.xnumel, ks.rnumel)
    space = schedules(xnumel, rnumel, ks.tile, ks.strided)
    nbytes = sum(graph.types[t].nbytes for t in ks.inputs + ks.outputs)
    itemsize = min((graph.types[t].dtype.itemsize for t in ks.inputs), default=4) if ks.strided else 0
    return space, rank(space, xnumel, rnumel, nbytes, dev or device("h100"), tile=ks.tile,
                       strided_itemsize=itemsize)
