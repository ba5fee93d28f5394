"""How much fp16 and tf32 rounding costs the zoo's random-weight models, construction by construction.

    python scripts/zoo_conditioning.py [--models mobilenet_v2,candy] [--precisions fp16,tf32]
        [--constructions legacy,zoo] [--size efficientvit_b0=1024] [--seed 0] [--out TABLE.md]

No GPU: each contender's arithmetic is emulated on the CPU, against the model in float64:
- fp16: `model.half()` (a CPU fp16 convolution accumulates wider and rounds its output once, as
  cuDNN's fp32 accumulation does; every other op reads and writes fp16);
- tf32: float32, with both operands of every convolution, linear layer and matmul rounded to TF32
  (10 explicit mantissa bits, to nearest even), as tensor cores read them.
For each model and construction (how its weights and normalization statistics are set) it reports
the rel L2 error of each precision on one N(0, 1) input, the input dependence (rel L2 between the
float64 outputs for two N(0, 1) inputs: a constant output passes any tolerance, so a pass means
little when this is small), and the error relative to the input-dependent part of the output,
||out - ref|| / (||ref_b - ref_a|| / sqrt 2), which no constant offset can shrink. Prints a
markdown table last.

Constructions of the BatchNorm models (mobilenet_v2, inception_v3, efficientvit_b0):
- legacy: the zoo's calibration before 2026-11-23 (training-mode BatchNorms, one image per batch,
  per-image statistics averaged over 8 images);
- default: no calibration (the packages' initial statistics, mean 0 and variance 1);
- channel: each BatchNorm gets its input's per-channel mean and variance over one batch of 8
  random images, in eval mode, layer after layer;
- layer: per-channel means, one variance per BatchNorm (the mean of its channel variances);
- floor: channel, with each variance floored at 0.1x its layer's median;
- rms: no mean subtracted, one factor per BatchNorm (its input's mean square);
- shift:B: channel, with the BatchNorms a ReLU reads shifted to output mean B (their bias);
- zoo: `tessera.zoo.make` as it is now.
Of candy (InstanceNorm): zoo, and in_shift:B (the InstanceNorms a ReLU reads get bias B).
no_act (mobilenet_v2, inception_v3, candy) is a probe, not a construction: channel (zoo for
candy) with every activation replaced by the identity, the rounding floor of the architecture
without the amplification that its nonlinearities add.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tessera import zoo  # noqa: E402
from tessera.tolerance import TOLERANCE  # noqa: E402

BN_MODELS = ("mobilenet_v2", "inception_v3", "efficientvit_b0")
BN_CONSTRUCTIONS = ("legacy", "default", "channel", "layer", "floor", "rms", "shift:1", "no_act", "zoo")
CANDY_CONSTRUCTIONS = ("zoo", "in_shift:1", "no_act")
NORM = torch.nn.modules.batchnorm._BatchNorm
Stats = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


# --- the emulated precisions -------------------------------------------------------------------

def to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 (10 explicit mantissa bits), to nearest, ties to even."""
    bits = t.contiguous().view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return bits.view(torch.float32)


_MATRIX_OPS = {F.conv1d, F.conv2d, F.conv_transpose2d, F.linear, torch.matmul, torch.mm, torch.bmm,
               torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__}


class _TF32Operands(TorchFunctionMode):
    """Convolutions, linear layers and matmuls read their two tensor operands rounded to TF32."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in _MATRIX_OPS:
            args = tuple(to_tf32(a) if i < 2 and isinstance(a, torch.Tensor) and a.dtype == torch.float32
                         else a for i, a in enumerate(args))
        return func(*args, **(kwargs or {}))


_ACTIVATIONS = {F.relu, F.relu6, F.hardtanh, F.hardswish, torch.relu, torch.relu_}


class _NoActivations(TorchFunctionMode):
    """Every ReLU, ReLU6 and hardswish is the identity (the no_act probe)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in _ACTIVATIONS:
            return args[0]
        return func(*args, **(kwargs or {}))


def forward(model: torch.nn.Module, x: torch.Tensor, precision: str, linear: bool) -> torch.Tensor:
    """The model's output on `x` in `precision` (fp64 is the reference), as float64."""
    m = copy.deepcopy(model).eval()
    with torch.no_grad(), (_NoActivations() if linear else contextlib.nullcontext()):
        if precision == "fp64":
            return m.double()(x.double())
        if precision == "fp16":
            return m.half()(x.half()).double()
        with _TF32Operands():
            return m(x).double()


# --- the constructions -------------------------------------------------------------------------

def _legacy(model: torch.nn.Module, example: torch.Tensor) -> None:
    # The zoo's calibration until 2026-11-23: cumulative averages of one-image batch statistics.
    norms = [m for m in model.modules() if isinstance(m, NORM)]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    with torch.no_grad():
        for _ in range(zoo.CALIBRATION_BATCHES):
            model(torch.randn_like(example))
    for m in norms:
        m.momentum = 0.1
        m.eval()


def _per_channel(mean: torch.Tensor, var: torch.Tensor, square: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return mean, var


def _per_layer(mean: torch.Tensor, var: torch.Tensor, square: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return mean, var.mean().expand_as(var)


def _floored(mean: torch.Tensor, var: torch.Tensor, square: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return mean, torch.maximum(var, 0.1 * var.median())


def _uncentred(mean: torch.Tensor, var: torch.Tensor, square: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros_like(mean), square.mean().expand_as(square)


def _calibrate(model: torch.nn.Module, example: torch.Tensor, stats: Stats, shift: float) -> None:
    # One batch in eval mode; each BatchNorm's statistics are set just before it runs.
    norms = [m for m in model.modules() if isinstance(m, NORM)]
    fed = zoo.read_by_relu(model, (example,), norms) if shift else set()

    def set_statistics(bn: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        x = args[0]
        dims = [0, *range(2, x.dim())]
        var, mean = torch.var_mean(x, dim=dims, correction=0)
        new_mean, new_var = stats(mean, var, x.square().mean(dims))
        bn.running_mean.copy_(new_mean)
        bn.running_var.copy_(new_var)
        if bn in fed:
            bn.bias.data.fill_(shift)

    hooks = [m.register_forward_pre_hook(set_statistics) for m in norms]
    with torch.no_grad():
        model(torch.randn(zoo.CALIBRATION_BATCHES, *example.shape[1:]))
    for h in hooks:
        h.remove()


_RULES: dict[str, Stats] = {"channel": _per_channel, "layer": _per_layer, "floor": _floored, "rms": _uncentred}


def construct(name: str, construction: str, seed: int, size: int | None) -> tuple[torch.nn.Module, torch.Tensor]:
    """Model `name` built by `construction`, in eval mode, and an example input."""
    if construction == "zoo" and size is None:
        model, args = zoo.make(name, seed)
        return model, args[0]
    torch.manual_seed(seed)
    model, args = zoo.ZOO[name]() if size is None else zoo.ZOO[name](size)
    model.eval()
    kind, _, arg = construction.partition(":")
    if name == "candy":
        if kind == "in_shift":
            norms = [m for m in model.modules() if isinstance(m, torch.nn.InstanceNorm2d)]
            for m in zoo.read_by_relu(model, args, norms):
                m.bias.data.fill_(float(arg))
        return model, args[0]
    if kind == "zoo":  # the zoo's construction at another size
        if name in zoo.CALIBRATED:
            zoo.calibrate_batchnorm(model, args)
    elif kind == "legacy":
        _legacy(model, args[0])
    elif kind == "shift":
        _calibrate(model, args[0], _per_channel, float(arg))
    elif kind == "no_act":
        with _NoActivations():
            _calibrate(model, args[0], _per_channel, 0.0)
    elif kind in _RULES:
        _calibrate(model, args[0], _RULES[kind], 0.0)
    elif kind != "default":
        raise SystemExit(f"unknown construction {construction!r}")
    return model.eval(), args[0]


# --- measuring ---------------------------------------------------------------------------------

def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out - ref).norm() / ref.norm())


def measure(name: str, construction: str, precisions: list[str], seed: int, size: int | None) -> dict:
    t = time.perf_counter()
    model, example = construct(name, construction, seed, size)
    linear = construction == "no_act"
    gen = torch.Generator().manual_seed(seed + 1)
    a, b = (torch.randn(example.shape, generator=gen) for _ in range(2))
    ref_a, ref_b = forward(model, a, "fp64", linear), forward(model, b, "fp64", linear)
    varying = float((ref_b - ref_a).norm()) / 2 ** 0.5
    row: dict = {"model": name, "size": example.shape[-1], "construction": construction,
                 "dependence": rel_l2(ref_b, ref_a)}
    for p in precisions:
        err = forward(model, a, p, linear) - ref_a
        row[p] = float(err.norm() / ref_a.norm())
        row[p + "_varying"] = float(err.norm()) / varying
    row["seconds"] = time.perf_counter() - t
    return row


def table(rows: list[dict], precisions: list[str]) -> str:
    head = (["model", "size", "construction"] + [f"{p} rel L2" for p in precisions] + ["input dependence"]
            + [f"{p} err / input-dependent part" for p in precisions] + ["passes"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * 3 + " ---: |" * (2 * len(precisions) + 1) + " --- |"]
    for r in rows:
        passes = ", ".join(f"{p} {'yes' if r[p] < TOLERANCE[p] else 'NO'}" for p in precisions)
        cells = ([r["model"], str(r["size"]), r["construction"]] + [f"{r[p]:.1e}" for p in precisions]
                 + [f"{r['dependence']:.2f}"] + [f"{r[p + '_varying']:.1e}" for p in precisions] + [passes])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v2,inception_v3,efficientvit_b0,candy")
    ap.add_argument("--precisions", default="fp16,tf32")
    ap.add_argument("--constructions", default="",
                    help=f"comma-separated; default {','.join(BN_CONSTRUCTIONS)} "
                         f"(candy: {','.join(CANDY_CONSTRUCTIONS)}; efficientvit_b0: no no_act)")
    ap.add_argument("--size", action="append", default=[], metavar="MODEL=N",
                    help="input height and width for a model (default: the zoo's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="also write the table to this markdown file")
    args = ap.parse_args()
    precisions = args.precisions.split(",")
    sizes = {k: int(v) for k, v in (s.split("=") for s in args.size)}
    rows = []
    for name in args.models.split(","):
        chosen = args.constructions.split(",") if args.constructions else (
            CANDY_CONSTRUCTIONS if name == "candy" else
            [c for c in BN_CONSTRUCTIONS if not (name == "efficientvit_b0" and c == "no_act")])
        for c in chosen:
            row = measure(name, c, precisions, args.seed, sizes.get(name))
            rows.append(row)
            print(f"{name} {c}: " + ", ".join(f"{p} {row[p]:.1e}" for p in precisions)
                  + f", input dependence {row['dependence']:.2f} ({row['seconds']:.0f}s)", flush=True)
    md = table(rows, precisions)
    print(md)
    if args.out:
        args.out.write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
