"""Which reference does a TF32 run match? (issue 13: candy and inception_v3 fail 1e-3 in tf32 for
every contender, eager PyTorch included.)

    PYTHONPATH=. python scripts/tf32_reference_probe.py --models candy,inception_v3 --solver highs

For each zoo model, the outputs of eager PyTorch (fp32 and tf32), and of tessera's tf32 plan
(analytical cost), are compared (rel L2) with four float64 references computed by the same PyTorch
module on the GPU: exact, and with every convolution's and linear layer's operands rounded to TF32
first, to nearest with ties away (Triton's cvt.rna and `tessera.verify.to_tf32`), to nearest even,
or by truncation (the tensor core reading the top 19 bits of a float32). If a contender's tf32
output sits far closer to one emulation than to the exact reference, its error against the exact
one is the TF32 floor of the network and that emulation is a reference that still checks a tf32
run at the 1e-3 tolerance. Prints one table last.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

MASK = -8192  # ~0x1FFF: the 13 low mantissa bits that TF32 drops


def to_tf32(x: torch.Tensor, mode: str) -> torch.Tensor:
    """x rounded to TF32 (kept in x's dtype): 'rna' to nearest/ties away, 'rne' to nearest even,
    'trunc' toward zero."""
    i = x.float().view(torch.int32)
    if mode == "rna":
        i = i + 0x1000
    elif mode == "rne":
        i = i + 0xFFF + ((i >> 13) & 1)
    return (i & MASK).view(torch.float32).to(x.dtype)


def emulated(model: torch.nn.Module, mode: str | None) -> torch.nn.Module:
    """A float64 copy of `model` whose convolutions and linear layers read TF32-rounded operands."""
    m = copy.deepcopy(model).double()
    if mode is None:
        return m
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.ConvTranspose2d, torch.nn.Linear)):
            with torch.no_grad():
                mod.weight.copy_(to_tf32(mod.weight, mode))
            mod.register_forward_pre_hook(lambda _m, args: tuple(to_tf32(a, mode) if torch.is_tensor(a) else a
                                                                  for a in args))
    return m


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def tessera_tf32(name: str, x: torch.Tensor, solver: str, dev: torch.device) -> torch.Tensor:
    import numpy as np

    from tessera import CompileOptions
    from tessera.compiler import compile_model, plan_document
    from tessera.frontend import load as frontend_load
    from tessera.runtime.executable import Executable
    from tessera.zoo import build

    path = build(name, Path(tempfile.mkdtemp()), 0)
    graph = frontend_load(path).graph
    result = compile_model(path, CompileOptions(precision="tf32", cost="analytical", solver=solver))
    exe = Executable(result.graph, plan_document(result), dev)
    feeds = {graph.inputs[0]: torch.from_numpy(np.ascontiguousarray(x.cpu().numpy()))}
    got = exe.run(**feeds)
    return got[exe.output_names[0]].float()


def main() -> None:
    from tessera.zoo import make

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="candy,inception_v3")
    ap.add_argument("--solver", default="highs")
    ap.add_argument("--no-tessera", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cpu":
        from tessera.codegen.launch import use_interpreter

        use_interpreter(dev)
    refs = ("exact", "rna", "rne", "trunc")
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model, (x,) = make(name, 0)
        model, x = model.to(dev), x.to(dev)
        with torch.no_grad():
            ref = {r: emulated(model, None if r == "exact" else r)(x.double()) for r in refs}
            outs = {}
            for tf32 in (False, True):
                torch.backends.cuda.matmul.allow_tf32 = tf32
                torch.backends.cudnn.allow_tf32 = tf32
                outs["eager " + ("tf32" if tf32 else "fp32")] = model(x).float()
            # Two rounding modes against each other: how far apart the emulations themselves are.
            outs["emulated rna"] = ref["rna"].float()
        if not args.no_tessera:
            outs["tessera tf32"] = tessera_tf32(name, x, args.solver, dev)
        for who, out in outs.items():
            rows.append((name, who, [rel(out, ref[r]) for r in refs]))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"\n{torch.cuda.get_device_name() if dev.type == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print("| model | output | " + " | ".join(f"vs {r}" for r in refs) + " |")
    print("| --- | --- |" + " ---: |" * len(refs))
    for name, who, errs in rows:
        print(f"| {name} | {who} | " + " | ".join(f"{e:.1e}" for e in errs) + " |")


if __name__ == "__main__":
    main()
