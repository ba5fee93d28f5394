"""Export small random-weight models of many transformers architectures to ONNX, for a breadth check.

The zoo (`tessera/zoo.py`) holds the benchmark models at full size. This script covers the families a
user is likely to bring next: encoders (BERT-like, T5, DeBERTa), decoder-only language models (Llama,
Mistral, Qwen2, Phi, GPT-NeoX, OPT, Bloom, Falcon, Gemma), vision transformers and CNNs (ViT, DeiT, Swin,
ConvNeXt, ResNet, MobileViT, BEiT, DINOv2, CLIP's vision tower, RegNet), and audio encoders (Whisper,
Wav2Vec2). Each is built from its config with two layers and a small width, so that
`scripts/check_models.py` can compile and check it on the CPU with Triton's interpreter. Exports use the
zoo's exporter settings (`torch.onnx.export(..., dynamo=True)`); `--legacy` uses the TorchScript exporter.

    python scripts/arch_zoo.py OUT [--models llama,vit,...] [--legacy]
    python scripts/check_models.py OUT --cost analytical --out OUT/check.json
    python scripts/arch_zoo.py --backend [--precision fp32] [--models ...]   # torch.compile(backend=tessera)
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera.zoo import _quiet_exporter  # noqa: E402

TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=512,
            max_position_embeddings=128)
SEQ = 24  # not a power of two: masks and padding see it


class First(torch.nn.Module):
    """The model's first output tensor (last_hidden_state), from keyword inputs given by position."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        out = self.model(**dict(zip(self.names, args)))
        return out[0] if isinstance(out, (tuple, list)) else next(iter(out.values()))


def _text(cls: str, cfg_cls: str, encoder: bool = False, **over) -> Callable[[], tuple[torch.nn.Module, tuple]]:
    def make():
        import transformers

        cfg = getattr(transformers, cfg_cls)(**{**TEXT, **over})
        if hasattr(cfg, "use_cache"):
            cfg.use_cache = False
        model = getattr(transformers, cls)(cfg)
        if encoder:  # an encoder-decoder's encoder alone
            model = model.get_encoder()
        ids = torch.randint(0, cfg.vocab_size, (2, SEQ))
        return First(model, ("input_ids",)), (ids,)
    return make


def _image(cls: str, cfg_cls: str, size: int = 64, **over) -> Callable[[], tuple[torch.nn.Module, tuple]]:
    def make():
        import transformers

        cfg = getattr(transformers, cfg_cls)(**over)
        model = getattr(transformers, cls)(cfg)
        return First(model, ("pixel_values",)), (torch.randn(1, 3, size, size),)
    return make


def _audio(cls: str, cfg_cls: str, shape: tuple[int, ...], name: str, **over) -> Callable:
    def make():
        import transformers

        model = getattr(transformers, cls)(getattr(transformers, cfg_cls)(**over))
        if cls == "WhisperModel":
            model = model.get_encoder()
        return First(model, (name,)), (torch.randn(*shape),)
    return make


VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=64,
           patch_size=16)
DECODER = dict(num_key_value_heads=2)  # grouped-query attention, as the released models use
MOE = dict(num_experts_per_tok=2, experts_implementation="batched_mm", **DECODER)
ARCHS: dict[str, Callable[[], tuple[torch.nn.Module, tuple]]] = {
    "bert": _text("BertModel", "BertConfig"),
    "roberta": _text("RobertaModel", "RobertaConfig"),
    "distilbert": _text("DistilBertModel", "DistilBertConfig", dim=64, n_layers=2, n_heads=4, hidden_dim=128),
    "albert": _text("AlbertModel", "AlbertConfig", embedding_size=32),
    "electra": _text("ElectraModel", "ElectraConfig", embedding_size=32),
    "deberta_v2": _text("DebertaV2Model", "DebertaV2Config"),
    "t5_encoder": _text("T5EncoderModel", "T5Config", d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4),
    "llama": _text("LlamaModel", "LlamaConfig", **DECODER),
    "mistral": _text("MistralModel", "MistralConfig", **DECODER),
    "qwen2": _text("Qwen2Model", "Qwen2Config", **DECODER),
    "gemma": _text("GemmaModel", "GemmaConfig", head_dim=16, **DECODER),
    "phi": _text("PhiModel", "PhiConfig"),
    "gpt_neox": _text("GPTNeoXModel", "GPTNeoXConfig"),
    "opt": _text("OPTModel", "OPTConfig", ffn_dim=128, word_embed_proj_dim=64),
    "bloom": _text("BloomModel", "BloomConfig", n_layer=2, n_head=4),
    "falcon": _text("FalconModel", "FalconConfig"),
    "vit": _image("ViTModel", "ViTConfig", **VIT),
    "deit": _image("DeiTModel", "DeiTConfig", **VIT),
    "beit": _image("BeitModel", "BeitConfig", **VIT),
    "dinov2": _image("Dinov2Model", "Dinov2Config", **VIT),
    "clip_vision": _image("CLIPVisionModel", "CLIPVisionConfig", **VIT),
    "swin": _image("SwinModel", "SwinConfig", embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                   image_size=64, patch_size=4),
    "convnext": _image("ConvNextModel", "ConvNextConfig", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
    "resnet": _image("ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]),
    "regnet": _image("RegNetModel", "RegNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                     groups_width=8),
    "mobilevit": _image("MobileViTModel", "MobileViTConfig", image_size=64, hidden_sizes=[32, 48, 64],
                        neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 128]),
    "whisper_encoder": _audio("WhisperModel", "WhisperConfig", (1, 16, 200), "input_features", d_model=64,
                              encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                              decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
                              max_source_positions=100, vocab_size=512, pad_token_id=1, bos_token_id=2,
                              eos_token_id=3, decoder_start_token_id=2),
    "wav2vec2": _audio("Wav2Vec2Model", "Wav2Vec2Config", (1, 4000), "input_values", hidden_size=64,
                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                       num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
    # session 50, second batch
    "bart_encoder": _text("BartModel", "BartConfig", encoder=True, d_model=64, encoder_layers=2, decoder_layers=1,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                          decoder_ffn_dim=128),
    "mpnet": _text("MPNetModel", "MPNetConfig"),
    "squeezebert": _text("SqueezeBertModel", "SqueezeBertConfig", embedding_size=64, q_groups=2, k_groups=2,
                         v_groups=2, post_attention_groups=2, intermediate_groups=4, output_groups=4),
    "convbert": _text("ConvBertModel", "ConvBertConfig", embedding_size=64),
    "clip_text": _text("CLIPTextModel", "CLIPTextConfig", pad_token_id=1, bos_token_id=0, eos_token_id=2),
    "swinv2": _image("Swinv2Model", "Swinv2Config", embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4,
                     image_size=64, patch_size=4),
    "convnextv2": _image("ConvNextV2Model", "ConvNextV2Config", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
    "efficientnet": _image("EfficientNetModel", "EfficientNetConfig", image_size=64, width_coefficient=0.25,
                           depth_coefficient=0.25, hidden_dim=320),
    "mobilenet_v2": _image("MobileNetV2Model", "MobileNetV2Config", image_size=64, depth_multiplier=0.35),
    "levit": _image("LevitModel", "LevitConfig", image_size=64, hidden_sizes=[32, 48, 64],
                    num_attention_heads=[1, 2, 2], depths=[1, 1, 1], key_dim=[8, 8, 8]),
    "poolformer": _image("PoolFormerModel", "PoolFormerConfig", hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1]),
    "yolos": _image("YolosModel", "YolosConfig", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, image_size=[64, 64], patch_size=16, num_detection_tokens=5),
    "hubert": _audio("HubertModel", "HubertConfig", (1, 4000), "input_values", hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                     conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
    "videomae": _audio("VideoMAEModel", "VideoMAEConfig", (1, 4, 3, 32, 32), "pixel_values", hidden_size=64,
                       num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
                       patch_size=16, num_frames=4, tubelet_size=2),
    "fnet": _text("FNetModel", "FNetConfig", use_tpu_fourier_optimizations=False),
    # session 51: mixture-of-experts decoders, the router's TopK (k = 2 of 4 experts) among their ops. The
    # experts run batched (every expert on every token, weighted by the router; MOE): transformers' default,
    # grouped_mm, is a custom op the ONNX exporter cannot translate, and its "eager" loop over the experts
    # the router hit has a data-dependent trip count that torch.export refuses.
    "mixtral": _text("MixtralModel", "MixtralConfig", num_local_experts=4, **MOE),
    "qwen2_moe": _text("Qwen2MoeModel", "Qwen2MoeConfig", num_experts=4, moe_intermediate_size=64,
                       shared_expert_intermediate_size=64, **MOE),
    # session 51, third batch: rotary decoders of another layout (gptj, codegen), character hashing with
    # remainders and strided downsampling (canine), SegFormer-like depth (glpn), folded patches (mobilevitv2's
    # Col2Im), audio (data2vec_audio), two more vision towers and a multilingual encoder
    "gptj": _text("GPTJModel", "GPTJConfig", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128),
    "codegen": _text("CodeGenModel", "CodeGenConfig", n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=128),
    "xlm_roberta": _text("XLMRobertaModel", "XLMRobertaConfig"),
    "canine": _text("CanineModel", "CanineConfig", num_hash_buckets=64, local_transformer_stride=4,
                    downsampling_rate=4),
    "glpn": _image("GLPNModel", "GLPNConfig", hidden_sizes=[16, 32, 48, 64], num_attention_heads=[1, 2, 2, 4],
                   depths=[1, 1, 1, 1]),
    "mobilevitv2": _image("MobileViTV2Model", "MobileViTV2Config", image_size=64, width_multiplier=0.5),
    "data2vec_audio": _audio("Data2VecAudioModel", "Data2VecAudioConfig", (1, 4000), "input_values", hidden_size=64,
                             num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, conv_dim=(32, 32, 32),
                             conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                             num_conv_pos_embedding_groups=4),
    "owlvit_vision": _image("OwlViTVisionModel", "OwlViTVisionConfig", **VIT),
    "siglip_vision": _image("SiglipVisionModel", "SiglipVisionConfig", **VIT),
    # session 51, fourth batch: focal modulation, pyramid attention with spatial reduction, a depthwise CNN,
    # DPT's ViT encoder, I-JEPA, and a video transformer with tubelets
    "focalnet": _image("FocalNetModel", "FocalNetConfig", embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
                       focal_windows=[3, 3], image_size=64, patch_size=4),
    "pvt_v2": _image("PvtV2Model", "PvtV2Config", hidden_sizes=[16, 32], depths=[1, 1], num_attention_heads=[1, 2],
                     sr_ratios=[2, 1], num_encoder_blocks=2, mlp_ratios=[2, 2], patch_sizes=[7, 3], strides=[4, 2]),
    "mobilenet_v1": _image("MobileNetV1Model", "MobileNetV1Config", image_size=64, depth_multiplier=0.25),
    "dpt": _image("DPTModel", "DPTConfig", backbone_out_indices=[0, 1], neck_hidden_sizes=[16, 32],
                  fusion_hidden_size=32, readout_type="project", **VIT),
    "ijepa": _image("IJepaModel", "IJepaConfig", **VIT),
    "vivit": _audio("VivitModel", "VivitConfig", (1, 4, 3, 32, 32), "pixel_values", hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, image_size=32, num_frames=4, tubelet_size=[2, 16, 16]),
}


def condition(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights that keep activations near unit scale through the layers. transformers' initializers
    (std 0.02) make some random models' outputs vanish: mobilevit's is all zeros, and a check against
    zeros passes any kernel that writes zeros. Matrices and filters get std 1/sqrt(fan-in); vectors
    (biases, norm scales) move off their initial values by 0.1 so that they matter."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.dim() >= 2:
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                p.add_(0.1 * noise)


def export(name: str, out: Path, legacy: bool = False, dynamic_seq: bool = False) -> tuple[Path, float]:
    """Build architecture `name` (seed 0, conditioned, eval mode) and write OUT/name.onnx (weights
    inside); returns the path and the output's standard deviation (a vanishing output checks nothing).
    `dynamic_seq`: a text model's sequence axis (the input's axis 1) stays symbolic, "seq", for
    `tessera compile --dynamic args_0=1:MIN..MAX`."""
    torch.manual_seed(0)
    model, args = ARCHS[name]()
    condition(model)
    model = model.eval()
    with torch.no_grad():
        std = float(model(*args).float().std())
    path = out / f"{name}.onnx"
    with torch.no_grad(), _quiet_exporter():
        if legacy:
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=17)
        else:
            # the forward takes *args: one spec per positional input, inside the tuple for *args
            shapes = (({1: torch.export.Dim("seq", min=2, max=128)},),) if dynamic_seq else None
            torch.onnx.export(model, args, dynamo=True, optimize=True, verbose=False,
                              dynamic_shapes=shapes).save(str(path), external_data=False)
    return path, std


def through_backend(name: str, precision: str, device: str) -> tuple[float, float, int, int, str]:
    """Architecture `name` through `torch.compile(backend="tessera")` (analytical cost) against eager in
    float64; returns the rel L2 error, the seconds of the first call, how many graphs dynamo made, how
    many of them run in PyTorch because tessera cannot represent them, and the reference. Where the
    model in float64 is not finite and in float32 is (canine scales a float32 copy of its attention mask
    by float64's least value: -inf, and 0 x -inf is NaN), the reference is float32 eager."""
    import torch._dynamo

    from tessera.tolerance import rel_l2
    from tessera.torch_backend import dynamo_compile, options_from

    torch.manual_seed(0)
    model, args = ARCHS[name]()
    condition(model)
    model = model.eval().to(device)
    args = tuple(a.to(device) for a in args)
    with torch.no_grad():
        # on a copy: a model that caches tensors in eval mode (LeViT's attention biases) keeps float64 ones
        wide = copy.deepcopy(model).double()
        ref = wide(*(a.double() if a.is_floating_point() else a for a in args)).float().cpu().numpy()
        reference = "float64 eager"
        if not np.isfinite(ref).all():
            narrow = model(*args).float().cpu().numpy()
            if np.isfinite(narrow).all():
                ref, reference = narrow, "float32 eager (float64 eager is not finite)"
        torch._dynamo.reset()
        fast, graphs = dynamo_compile(model, options_from({"precision": precision, "cost": "analytical"}))
        t = time.perf_counter()
        got = fast(*args).float().cpu().numpy()
    # a graph tessera could not represent runs in PyTorch (`torch_backend.compile_or_eager`): not tessera's
    eager = sum(isinstance(getattr(g, "__self__", None), torch.fx.GraphModule) for g in graphs)
    return rel_l2(got, ref), time.perf_counter() - t, len(graphs), eager, reference


def backend_sweep(names: list[str], precision: str, device: str) -> int:
    from tessera.tolerance import TOLERANCE

    rows, failed = [], 0
    for name in names:
        try:
            err, secs, graphs, eager, reference = through_backend(name, precision, device)
            verdict = "PASS" if err < TOLERANCE[precision] else "FAIL"
            if eager:
                verdict += f" ({eager} of {graphs} graphs in PyTorch)"
            if reference != "float64 eager":
                verdict += f" (against {reference})"
        except Exception as e:  # a failure to report, then the next architecture
            err, secs, graphs, verdict = float("nan"), 0.0, 0, f"ERROR {type(e).__name__}: {str(e)[:160]}"
            traceback.print_exc(limit=3, file=sys.stderr)
        failed += not verdict.startswith("PASS")
        rows.append((name, err, secs, graphs, verdict))
        print(f"{name}: rel L2 {err:.2e} vs float64 eager, {graphs} graph(s), first call {secs:.1f} s: {verdict}",
              flush=True)
    print("\n| architecture | rel L2 vs float64 | graphs | first call s | verdict |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, err, secs, graphs, verdict in rows:
        print(f"| {name} | {err:.2e} | {graphs} | {secs:.1f} | {verdict} |")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--models", default=",".join(ARCHS))
    ap.add_argument("--legacy", action="store_true", help="the TorchScript exporter (opset 17)")
    ap.add_argument("--backend", action="store_true", help="torch.compile(backend='tessera') instead of exports")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.backend:
        return backend_sweep(args.models.split(","), args.precision, args.device)
    if args.out is None:
        ap.error("OUT is needed to export")
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.models.split(","):
        t = time.perf_counter()
        try:
            path, std = export(name, args.out, args.legacy)
            print(f"{name}: {path.stat().st_size / 1e6:.2f} MB, output std {std:.3g}, {time.perf_counter() - t:.1f} s"
                  + ("  (VANISHING: a check of this output shows little)" if not 1e-2 < std < 1e3 else ""), flush=True)
        except Exception as e:  # an architecture this transformers or exporter cannot build: say so, go on
            failed += 1
            print(f"{name}: NOT EXPORTED: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}",
                  flush=True)
            traceback.print_exc(limit=2, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
