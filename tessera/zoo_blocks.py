"""Korch's three case-study blocks (Korch §3 and §6), as zoo models in plain PyTorch.

Each is the block at the size it has inside its benchmark model, batch 1:
- `segformer_attn`: SegFormer-B0's first-stage efficient self-attention. 128x128 tokens of width
  32, one head; keys and values come from the tokens reduced 8x8 by a strided convolution and a
  LayerNorm (16384 queries against 256 keys).
- `efficientvit_attn`: EfficientViT-B0's ReLU linear attention (timm's LiteMLA without its
  multi-scale branch) at 2048x2048 input, third stage: 64 channels of 128x128 positions, heads of
  16. Values get a column of ones (the pad), so one product gives the numerators and the
  normaliser; the key-value product [17, 16384] x [16384, 16] is the extreme-aspect matmul.
- `candy_norm_pad`: candy's InstanceNorm -> ReLU -> reflection pad, at its residual blocks' size
  (128 channels, 56x56 at 224x224 input).

`sdpa_block` gives the segformer block through `F.scaled_dot_product_attention` for bench's
`sdpa` peer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class SegformerAttention(torch.nn.Module):
    def __init__(self, width: int = 32, heads: int = 1, reduction: int = 8, side: int = 128,
                 sdpa: bool = False) -> None:
        super().__init__()
        self.heads, self.side, self.sdpa = heads, side, sdpa
        self.q, self.k, self.v, self.out = (torch.nn.Linear(width, width) for _ in range(4))
        self.sr = torch.nn.Conv2d(width, width, reduction, reduction)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [1, tokens, width]
        b, n, c = x.shape
        d = c // self.heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(b, -1, self.heads, d).transpose(1, 2)

        image = x.transpose(1, 2).reshape(b, c, self.side, self.side)
        reduced = self.norm(self.sr(image).reshape(b, c, -1).transpose(1, 2))
        q, k, v = heads(self.q(x)), heads(self.k(reduced)), heads(self.v(reduced))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, n, c))


def segformer_attn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return SegformerAttention(), (torch.randn(1, 128 * 128, 32),)


class LinearAttention(torch.nn.Module):
    def __init__(self, channels: int = 64, head_dim: int = 16, eps: float = 1e-15) -> None:
        super().__init__()
        self.head_dim, self.eps = head_dim, eps
        self.qkv = torch.nn.Conv2d(channels, 3 * channels, 1, bias=False)
        self.proj = torch.nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [1, C, H, W]
        b, c, h, w = x.shape
        qkv = self.qkv(x).reshape(b, -1, 3 * self.head_dim, h * w)
        q, k, v = qkv.chunk(3, dim=2)  # each [b, heads, d, N]
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), value=1.0)  # a row of ones: the normaliser rides in the product
        vk = v @ k.transpose(-1, -2)  # [b, heads, d + 1, d]: the long axis N is contracted
        out = vk @ q  # [b, heads, d + 1, N]
        out = out[:, :, :-1] / (out[:, :, -1:] + self.eps)
        return self.proj(out.reshape(b, c, h, w))


def efficientvit_attn() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return LinearAttention(), (torch.randn(1, 64, 128, 128),)


def candy_norm_pad() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    block = torch.nn.Sequential(torch.nn.InstanceNorm2d(128, affine=True), torch.nn.ReLU(), torch.nn.ReflectionPad2d(1))
    return block, (torch.randn(1, 128, 56, 56),)


def sdpa_block(model: torch.nn.Module) -> torch.nn.Module | None:
    """The segformer block computing its attention through SDPA (same weights), else None."""
    if not isinstance(model, SegformerAttention):
        return None
    twin = SegformerAttention(sdpa=True)
    ref = next(model.parameters())
    twin.load_state_dict(model.state_dict())
    return twin.to(device=ref.device, dtype=ref.dtype).eval()


BLOCKS = {"segformer_attn": segformer_attn, "efficientvit_attn": efficientvit_attn, "candy_norm_pad": candy_norm_pad}
