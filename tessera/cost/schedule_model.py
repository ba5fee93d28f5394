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

GEMM templates (`codegen/gemm.py`) are ranked by `predict_gemm`, which prices a GEMM as the 1x1
convolution with the same tiles under the convolution model below (one model for both
implicit-GEMM forms; `scripts/gemm_rank_check.py` checks it on the GEMM probes' timings). The
ranking leads with the best schedule of each of its first `GEMM_FAMILIES` tile shapes, and those
are measured. Convolution templates
(`codegen/conv.py`) are ranked by `predict_conv`: for the implicit GEMM, a weighted sum of time
terms (`conv_terms`) whose weights were fitted to the H100 probe of session 24
(`scripts/conv_sweep_probe.py`, `scripts/conv_fit.py`); the direct (depthwise) form keeps an
unfitted roofline of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

from tessera.codegen.chain import chain_roots
from tessera.codegen.conv import ConvProblem, channels_innermost, conv_problem, conv_root, conv_schedules
from tessera.codegen.gemm import column_slices, matmul_root, template_schedules, tile_problem
from tessera.codegen.kernels import ConvSchedule, GemmSchedule, KernelSource, Schedule, TemplateSchedule, schedules
from tessera.codegen.rotary import swap_width
from tessera.codegen.tile import cdiv
from tessera.codegen.triton_ops import Unsupported
from tessera.cost.devices import Device, device
from tessera.ir.dtype import DType
from tessera.ir.graph import Graph, Node
from tessera.ir.prims import Prim
from tessera.ir.tables import table_form


@dataclass(frozen=True)
class ScheduleParams:
    warps_to_saturate: float = 24.0  # warps per SM at which a streaming kernel reaches full bandwidth
    values_per_thread: float = 64.0  # register-resident values per thread before spilling
    # The same for a kernel that gathers along a contiguous axis with a loaded index (`gathers_inner`):
    # each element holds its own 64-bit index and address and no load vectorizes. segformer_b0's
    # bilinear W pass with its tables loaded (H200, fp16, `scripts/gather_probe.py`, session 44) ran
    # 8.7-8.8 us at 4 elements a thread and 13.1 at 8 (the flat schedules this model ranked first),
    # 9.9-13.1 at 1-2.
    gather_values_per_thread: float = 4.0
    spill_cost: float = 0.5  # extra time per doubling past values_per_thread
    loop_iteration_s: float = 1.0e-7  # per sequential chunk of a looped reduction (per program wave)
    max_warps_per_sm: int = 64


DEFAULT_PARAMS = ScheduleParams()


SECTOR_BYTES = 32


def predict(s: Schedule, xnumel: int, rnumel: int, nbytes: float, dev: Device,
            p: ScheduleParams = DEFAULT_PARAMS, strided_itemsize: int = 0, gathers: bool = False) -> float:
    """Predicted seconds of one launch under schedule s (only the ranking is meant to be right);
    `gathers`: the kernel gathers along a contiguous axis (`gathers_inner`)."""
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
    held = p.gather_values_per_thread if gathers else p.values_per_thread
    spill = 1.0 + p.spill_cost * max(0.0, math.log2(per_thread / held))
    waves = math.ceil(programs * s.num_warps / (dev.sms * p.max_warps_per_sm))
    stream = nbytes / (dev.bandwidth * saturation)
    if strided_itemsize:  # adjacent rows are adjacent in memory: a sector holds that many of them
        stream /= min(1.0, s.xblock * strided_itemsize / SECTOR_BYTES)
    return stream * spill + chunks * waves * p.loop_iteration_s


def rank(space: Sequence[Schedule], xnumel: int, rnumel: int, nbytes: float, dev: Device,
         p: ScheduleParams = DEFAULT_PARAMS, tile: tuple[int, int] | None = None,
         strided_itemsize: int = 0, gathers: bool = False) -> list[Schedule]:
    """The space from most to least promising (ties keep the space's order). A tiled pointwise
    schedule (rblock > 1 in a kernel with `tile`) is priced like a row kernel over (rows, columns);
    the model knows nothing of coalescing, which is what tiling is for."""
    def cost(s: Schedule) -> float:
        if tile is not None and rnumel <= 1 and s.rblock > 1:
            if s.persistent:
                return predict(s, tile[0], tile[1], nbytes, dev, p)
            # one tile a program (`codegen.kernels._tiled`): priced as that many programs of one block
            tiles = math.ceil(tile[0] / s.xblock) * math.ceil(tile[1] / s.rblock)
            return predict(replace(s, persistent=True), tiles * s.xblock, s.rblock, nbytes, dev, p)
        return predict(s, xnumel, rnumel, nbytes, dev, p, strided_itemsize, gathers)

    return sorted(space, key=cost)


def gathers_inner(graph: Graph, ks: KernelSource) -> bool:
    """Does the kernel gather with a loaded 1-D index along an axis its data holds contiguously?
    Its elements' loads are then one scalar load each, after a load of the index. An index the
    kernel computes from its position (`ir.tables`: a whole-number Resize's) does not count: with
    its tables computed, tessera's bilinear W pass ran best at 8 elements a thread (4.75 us against
    6.1-6.2 at 4, H200, fp16, `scripts/gather_probe.py --generated`, session 44)."""
    by_name = {n.name: n for n in graph.nodes}
    for name in ks.prims:
        n = by_name.get(name)
        if n is not None and n.op == Prim.GATHER.value and graph.types[n.inputs[1]].rank == 1 \
                and table_form(graph, n.inputs[1]) is None:
            data = graph.types[n.inputs[0]]
            if data.shape[n.attrs["axis"]] > 1 and data.strides[n.attrs["axis"]] == 1:
                return True
    return False


def rank_kernel(graph: Graph, ks: KernelSource, dev: Device | None = None) -> tuple[list[Schedule], list[Schedule]]:
    """A generated kernel's schedule space (the default first) and the same space ranked,
    with the kernel's own traffic; `dev` defaults to the H100 preset."""
    # A tiled kernel (xnumel rows of rnumel columns) has the same space as its flat form.
    xnumel, rnumel = (ks.xnumel * ks.rnumel, 1) if ks.tile and ks.schedule.rblock > 1 else (ks.xnumel, ks.rnumel)
    space = schedules(xnumel, rnumel, ks.tile, ks.strided)
    nbytes = sum(graph.types[t].nbytes for t in ks.inputs + ks.outputs)
    itemsize = min((graph.types[t].dtype.itemsize for t in ks.inputs), default=4) if ks.strided else 0
    return space, rank(space, xnumel, rnumel, nbytes, dev or device("h100"), tile=ks.tile,
                       strided_itemsize=itemsize, gathers=not ks.rnumel > 1 and gathers_inner(graph, ks))


# ---- GEMM templates ----------------------------------------------------------------------------


def _waves(programs: int, resident: int, dev: Device) -> tuple[int, int]:
    """(waves, programs on the busiest SM per wave) of `programs`, `resident` at a time per SM."""
    return math.ceil(programs / (dev.sms * resident)), math.ceil(min(programs, dev.sms * resident) / dev.sms)


GEMM_FAMILIES = 4  # tile shapes (block_m x block_n) whose best-ranked schedule is measured first


def gemm_as_conv(batch: int, m: int, n: int, k: int) -> ConvProblem:
    """A (batched) GEMM as the 1x1 convolution with the same tiles: M pixels, K input and N
    output channels per group, one group per batch entry."""
    return ConvProblem(1, k * batch, m, 1, n * batch, m, 1, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), batch)


def predict_gemm(s: GemmSchedule, batch: int, m: int, n: int, k: int, itemsize: int, operand_bytes: float,
                 epilogue_bytes: float, rate: float, dev: Device) -> float:
    """Predicted seconds of a GEMM template launch (only the ranking is meant to be right).

    A GEMM template walks the same tiles as the implicit-GEMM convolution template of a 1x1
    convolution, so it is priced by that model: `conv_terms` weighed by `CONV_PARAMS`, fitted to
    convolutions alone (session 24). On the two GEMM probes, BERT's and GPT-2's 128-row linear
    layers in fp16 (H100, session 21) and tf32 with K-major weights (H200, session 28), the best of
    its first four family heads is within 1.1% of the space's best (geomean, worst 9%), against
    6.9% (worst 16%) for session 21's own GEMM model, which was fitted to those very timings when
    tf32 dots ran on mma.sync (`scripts/gemm_rank_check.py`)."""
    terms = conv_terms(s, gemm_as_conv(batch, m, n, k), itemsize, operand_bytes, epilogue_bytes, rate, dev)
    return sum(getattr(CONV_PARAMS, name) * v for name, v in terms.items()) + CONV_PARAMS.launch_s


def family_heads(ranked: Sequence[GemmSchedule], families: int = GEMM_FAMILIES) -> list[GemmSchedule]:
    """`ranked` with the best schedule of each of its first `families` tile shapes moved to the front."""
    heads: dict[tuple[int, int], GemmSchedule] = {}
    for s in ranked:
        heads.setdefault((s.block_m, s.block_n), s)
    first = list(heads.values())[:families]
    return first + [s for s in ranked if s not in first]


def template_rate(dtype: DType, precision: str, dev: Device) -> float:
    """The matrix rate a template's dots run at: tensor cores for 16-bit operands and tf32, the
    CUDA cores for IEEE fp32."""
    if dtype in (DType.FLOAT16, DType.BFLOAT16):
        return dev.fp16
    return dev.tf32 if precision == "tf32" else dev.fp32


FORM_SLACK = 2.0  # a form's best schedule is measured early if predicted within this factor of the best


@dataclass(frozen=True)
class ConvParams:
    """Per-unit costs of `predict_conv`'s implicit-GEMM terms (`conv_terms`), fitted by
    non-negative least squares on relative error to 2,482 timed schedules of ResNet-50's and
    Inception-v3's convolutions on the H100, fp16 and tf32 (`scripts/conv_sweep_probe.py`, fitted
    by `scripts/conv_fit.py`, session 24). Left out: the DRAM floor, waves and per-thread terms,
    which the fit gave no weight."""

    compute: float = 1.60  # x the tile work of each SM's programs at its share of the rate
    l2: float = 3.06  # x every program's operand stream at L2 bandwidth (8x DRAM's)
    latency: float = 0.372  # x the round trips (1 us each) that reading through the bytes in flight takes
    step: float = 1.19  # x 0.1 us per K step of a program, per wave
    split_workspace: float = 1.28  # x the split-K workspace written and read at DRAM bandwidth
    split: float = 1.24  # x 1 us for a split tile's last program: waiting on the counter, summing the slices
    launch_s: float = 1.2e-6  # the intercept: what every launch costs
    # The direct form's roofline is not fitted (the sweep has no direct schedules): scaled by what
    # the best direct schedules of candy's 32 -> 3 convolution took over it in the H100 probes of
    # session 22 (1.6-1.9x, `scripts/results/conv_probe/*direct*`), so the forms compare.
    direct: float = 1.7
    direct_l2_factor: float = 4.0  # the direct form's L2 bandwidth over DRAM's (its tiles mostly hit L2)
    direct_step_s: float = 2.0e-8  # latency of one window step of the direct form that nothing hides
    max_warps_per_sm: int = 64


CONV_PARAMS = ConvParams()
CONV_TERMS = ("compute", "l2", "latency", "step", "split_workspace", "split")


def conv_terms(s: ConvSchedule, p: ConvProblem, itemsize: int, operand_bytes: float, epilogue_bytes: float,
               rate: float, dev: Device) -> dict[str, float]:
    """The time terms of an implicit-GEMM convolution template, at unit cost (`ConvParams` weighs
    them): the GEMM is groups x pixels x channels over K padded as the schedule walks it (per-tap
    channel blocks or flat), so padding counts as work.
    - compute: waves of resident programs, each SM's tile work at its share of the rate; a
      program of fewer than 4 warps leaves tensor cores of the SM's 4 sub-partitions idle
      unless other programs share the SM (the probe: 64x32 tiles run 15-27% faster on 4 warps
      than on 2);
    - l2: every program's gathered operand tiles (each input element once per tap covering it);
    - latency: round trips to read the operands, the epilogue and an eighth of the L2 stream
      through the bytes the resident programs keep in flight (stages - 1 tiles each);
    - step: the K steps one program walks, one after another, per wave (what split-K shortens);
    - split_workspace, split: split-K's fp32 partial tiles, and its last program's wait."""
    tiles = p.groups * cdiv(p.m, s.block_m) * cdiv(p.og, s.block_n)
    programs = tiles * s.split_k
    steps = cdiv(p.steps(s.block_k), s.split_k)
    chunk = steps * s.block_k
    tile_bytes = (s.block_m + s.block_n) * s.block_k * itemsize
    resident = max(1, min(dev.smem_bytes // max(s.num_stages * tile_bytes, 1), 64 // s.num_warps))
    active = min(programs, dev.sms * resident)
    waves, per_sm = _waves(programs, resident, dev)
    streamed = programs * (s.block_m + s.block_n) * chunk * itemsize
    in_flight = active * max(1, s.num_stages - 1) * tile_bytes
    split = s.split_k > 1
    return {
        "compute": waves * 2.0 * s.block_m * s.block_n * chunk / (rate / dev.sms) * max(per_sm, 4 / s.num_warps),
        "l2": streamed / (dev.bandwidth * 8),
        "latency": (operand_bytes + epilogue_bytes + streamed / 8) / in_flight * 1e-6,
        "step": waves * steps * 1e-7,
        "split_workspace": 8.0 * s.split_k * p.groups * p.m * p.og / dev.bandwidth if split else 0.0,
        "split": 1e-6 if split else 0.0,
    }


def predict_conv(s: ConvSchedule, p: ConvProblem, itemsize: int, operand_bytes: float, epilogue_bytes: float,
                 rate: float, dev: Device, channels_inner: bool, params: ConvParams = CONV_PARAMS) -> float:
    """Predicted seconds of a convolution template (only the ranking is meant to be right).

    Implicit GEMM: the weighted sum of `conv_terms` (fitted to H100 measurements: in the probe,
    the best of the model's first 2 schedules was within 9% of the best measured, geomean, and
    of its first 4 within 6%; leaving each shape out of the fit changed neither).
    Direct form (not probed): per step (a window tap, and an input channel of the group), an
    input tile and a multiply-add on the CUDA cores, in waves of resident programs. The tile is
    [block_m, block_n] where each output channel reads its own input channel (groups), else a
    [block_m, 1] column; loads are as wide as its contiguous run (channels of a channels-last
    depthwise input, pixels of a row-major one), in 32-byte sectors.
    """
    if s.block_k:
        terms = conv_terms(s, p, itemsize, operand_bytes, epilogue_bytes, rate, dev)
        return params.launch_s + sum(getattr(params, name) * terms[name] for name in CONV_TERMS)
    programs = math.ceil(p.m / s.block_m) * math.ceil(p.o / s.block_n)
    resident = max(1, params.max_warps_per_sm // s.num_warps)
    waves, per_sm = _waves(programs, resident, dev)
    taps = p.kh * p.kw * p.cg
    compute = 2.0 * s.block_m * s.block_n * taps / (dev.fp32 / dev.sms)
    lanes = s.block_n if p.groups > 1 else 1  # input channels a step's tile spans
    run = lanes if channels_inner else (s.block_m if p.strides[1] == 1 else 1)
    sector = min(1.0, run * itemsize / SECTOR_BYTES)
    stream = s.block_m * lanes * taps * itemsize / sector / (dev.bandwidth * params.direct_l2_factor / dev.sms)
    latency = taps * params.direct_step_s
    dram = (operand_bytes + epilogue_bytes) / dev.bandwidth
    return params.launch_s + params.direct * max(waves * max(per_sm * compute, per_sm * stream, latency), dram)


def rank_templates(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], precision: str = "fp32",
                   dev: Device | None = None) -> list[TemplateSchedule]:
    """A matmul or 2-D convolution kernel's template schedules (`codegen.gemm.template_schedules`,
    cut to the GPU's SM count; `codegen.conv.conv_schedules`), or a GEMM chain's (the evolutionary
    search of `cost/chain_search.py`), from most to least promising; empty when the kernel has none."""
    if chain_roots(nodes) is not None:  # two matmuls: a GEMM chain (cost/chain_search.py)
        from tessera.cost.chain_search import chain_search

        try:
            return list(chain_search(graph, nodes, outputs, precision, dev).ranked)
        except Unsupported:
            return []
    root = matmul_root(nodes)
    if root is None:
        croot = conv_root(nodes)
        return [] if croot is None else _rank_conv(graph, nodes, outputs, croot, precision, dev or device("h100"))
    return _rank_gemm(graph, nodes, outputs, root, precision, dev)


def _epilogue_bytes(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node) -> float:
    """What a template's epilogue reads besides the product, and what it writes."""
    produced = {o for nd in nodes for o in nd.outputs}
    reads = {t for nd in nodes if nd is not root for t in nd.inputs if t and t not in produced}
    return sum(graph.types[t].nbytes for t in reads) + sum(graph.types[t].nbytes for t in outputs)


def _rank_conv(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node, precision: str,
               dev: Device) -> list[TemplateSchedule]:
    p = conv_problem(graph, root)
    xt = graph.types[root.inputs[0]]
    itemsize = xt.dtype.itemsize
    space = conv_schedules(p, itemsize, dev.sms)
    operands = sum(graph.types[t].nbytes for t in root.inputs)
    epilogue = _epilogue_bytes(graph, nodes, outputs, root)
    rate = template_rate(xt.dtype, precision, dev)
    inner = channels_innermost(xt, p)
    seconds = {s: predict_conv(s, p, itemsize, operands, epilogue, rate, dev, inner) for s in space}
    ranked = sorted(space, key=seconds.__getitem__)
    # Each form's best leads (implicit GEMM, direct) where the model puts it within FORM_SLACK of
    # the best: the direct form's model is not fitted, so each form gets measured. (The direct form
    # on a channels-last multi-channel input reads strided columns: 4-8x slower, H100 probe; it is
    # ranked out of the heads.) Split and whole walks are not forced to lead: the fitted model
    # ranks them (the probe's best of 2 was 9% off the best leading with the model's first,
    # 14% leading with the best of each).
    firsts: dict[bool, ConvSchedule] = {}
    for s in ranked:  # each form's best, in rank order
        firsts.setdefault(s.block_k == 0, s)
    heads = [s for s in firsts.values() if seconds[s] <= FORM_SLACK * seconds[ranked[0]]]
    return heads + [s for s in ranked if s not in heads]


def _rank_gemm(graph: Graph, nodes: Sequence[Node], outputs: Sequence[str], root: Node, precision: str = "fp32",
               dev: Device | None = None) -> list[TemplateSchedule]:
    dev = dev or device("h100")
    batch, m, n, k, accs = tile_problem(graph, root, column_slices(graph, nodes, outputs, root))
    a_type = graph.types[root.inputs[0]]
    itemsize = a_type.dtype.itemsize
    space = template_schedules(batch, m, n, k, itemsize, dev.sms)
    if accs > 1:  # a product read through column slices: a tile per slice width, one walk of K for all,
        # and the accumulators together no larger than the menu's largest tile (128 x 256 floats: 128
        # registers a thread at 8 warps), past which they spill; each pipeline stage holds a B tile per
        # accumulator, within the SM's shared memory
        space = [s for s in space if s.split_k == 1 and s.block_m * s.block_n * accs <= 128 * 256
                 and s.num_stages * (s.block_m + accs * s.block_n) * s.block_k * itemsize <= dev.smem_bytes]
    heads = swap_width(graph, nodes, root)
    if heads > 1:  # rotate_half in the epilogue swaps columns within a tile: whole heads to a tile
        space = [s for s in space if s.block_n % heads == 0]
    operands = sum(graph.types[t].nbytes for t in root.inputs)
    epilogue = _epilogue_bytes(graph, nodes, outputs, root)
    rate = template_rate(a_type.dtype, precision, dev)
    # (priced as one product over accs times the K: the same tile work; it counts A's tiles accs times)
    return family_heads(sorted(space, key=lambda s: predict_gemm(s, batch, m, n, k * accs, itemsize, operands,
                                                                   epilogue, rate, dev)))
