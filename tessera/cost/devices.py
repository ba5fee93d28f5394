"""GPU presets for the analytical cost model.

Rates are what a kernel can reach, not marketing peaks. Sources:
- H100 SXM5 80GB and H200 SXM 141GB: NVIDIA datasheets for the arithmetic
  rates (dense, no sparsity). Memory bandwidth and the bf16 matrix rate are
  this workplace's measurements (device KINDS.md: a device-to-device copy moved
  3.0 TB/s on an H100, 2026-11-13, and 4.3 TB/s on an H200, 2026-10-28;
  an 8192^3 bf16 matmul ran at 798 and 769-798 TFLOP/s).
- A100 SXM4 80GB and V100 SXM2 32GB: NVIDIA datasheets; bandwidth scaled by
  0.9 and matrix rates by 0.8, the fractions measured on the H100/H200.
Later issues calibrate these from measured kernels.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes/s, achievable DRAM bandwidth
    fp32: float  # FLOP/s, CUDA-core fp32 (elementwise, reductions)
    tf32: float  # FLOP/s, tensor cores in tf32 mode
    fp16: float  # FLOP/s, tensor cores with fp16/bf16 operands
    launch: float  # s, GPU time lost per kernel inside a CUDA graph
    sms: int
    l2_bytes: int
    source: str
    smem_bytes: int = 227 << 10  # shared memory one thread block may use (the GEMM-chain search prunes by it)
    registers: int = 65536  # 32-bit registers per SM


DEVICES: dict[str, Device] = {
    "h100": Device("NVIDIA H100 SXM5 80GB", bandwidth=3.0e12, fp32=67e12, tf32=400e12, fp16=798e12,
                   launch=2.0e-6, sms=132, l2_bytes=50 << 20,
                   source="datasheet rates; copy bandwidth and bf16 matmul measured here 2026-11-13"),
    "h200": Device("NVIDIA H200 SXM 141GB", bandwidth=4.3e12, fp32=67e12, tf32=400e12, fp16=790e12,
                   launch=2.0e-6, sms=132, l2_bytes=60 << 20,
                   source="datasheet rates; copy bandwidth and bf16 matmul measured here 2026-10-28"),
    "a100": Device("NVIDIA A100 SXM4 80GB", bandwidth=0.9 * 2.039e12, fp32=19.5e12, tf32=0.8 * 156e12,
                   fp16=0.8 * 312e12, launch=2.5e-6, sms=108, l2_bytes=40 << 20,
                   source="datasheet, scaled by the efficiencies measured on H100/H200", smem_bytes=163 << 10),
    "v100": Device("NVIDIA V100 SXM2 32GB", bandwidth=0.9 * 900e9, fp32=15.7e12, tf32=15.7e12,
                   fp16=0.8 * 125e12, launch=3.0e-6, sms=80, l2_bytes=6 << 20,
                   source="datasheet (no tf32: fp32 rate), scaled like the A100", smem_bytes=96 << 10),
}

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")

# The preset of a GPU by the family its CUDA name carries (`torch.cuda.get_device_name`), newest first.
FAMILIES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("V100", "v100"))
DEFAULT_PRESET = "h100"  # where no GPU is visible (an analytical compile for the GPU this project targets)


def device(name: str) -> Device:
    try:
        return DEVICES[name.lower()]
    except KeyError:
        raise KeyError(f"unknown GPU '{name}'; presets: {', '.join(DEVICES)}") from None


def preset_for(cuda_name: str) -> str | None:
    """The preset of the GPU that CUDA names `cuda_name` ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"),
    or None for a family without one."""
    upper = cuda_name.upper()
    return next((preset for family, preset in FAMILIES if family in upper), None)


def resolve_preset(gpu: str, cuda_name: str | None) -> tuple[str, str]:
    """The preset a compile uses and why: `gpu` itself unless it is "auto", which takes the visible
    GPU's (`cuda_name`, None where there is none) and the default where it has none. The presets
    differ in shared memory per block (the chain and template spaces are pruned by it: a V100's 96
    KB against an H100's 227) and in the bandwidth the analytical prices, bounds and variants use."""
    if gpu != "auto":
        return gpu, "chosen"
    if cuda_name is None:
        return DEFAULT_PRESET, "no GPU visible"
    preset = preset_for(cuda_name)
    if preset is None:
        return DEFAULT_PRESET, f"no preset for {cuda_name}"
    return preset, cuda_name
