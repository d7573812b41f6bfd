#!/usr/bin/env python3
"""Random-weight benchmark models of realistic small shape, built with the fixture script.

    /work/venv/bin/python bench/make_models.py [OUT_DIR] [--only NAME ...]

OUT_DIR defaults to /tmp/hsx-bench/models (keep it outside the repository: the dense
model is 0.6 GB in f32). Writes one Hugging Face checkpoint per model:

    llama_f32, llama_bf16     LlamaForCausalLM: hidden 1024, 8 layers, intermediate 2816,
                              16 heads / 4 KV heads (head_dim 64), vocab 32000, untied head
                              (155.7M parameters, as python-reference.md §5b)
    qwen3_5_f32, qwen3_5_bf16 Qwen3.5-like dense hybrid: 6 Gated DeltaNet + 2 gated attention
                              layers (3:1), 8 heads x 128, 2 KV heads, linear k-heads 8,
                              v-heads 16, head dim 64 (§5b)
    qwen3_moe_f32, _bf16      Qwen3-MoE-like (Qwen3-30B-A3B scaled down): 8 layers, 16 heads /
                              4 KV heads x 64 with q/k norm, 16 experts x 512, top-4
                              renormalised, every layer sparse (288M parameters, 50M active)
    glm4_moe_f32, _bf16       GLM-4.5-like (Glm4MoeForCausalLM, GLM-4.5-Air scaled down): 8
                              layers, 16 heads / 4 KV heads x 64 with biased q/k/v, rotary on
                              half of each head, layer 0 a dense MLP (2816), then 16 experts x
                              512 top-4 by the sigmoid router (choice bias), renormalised, and a
                              shared expert of 512
    glm4_moe_lite_f32, _bf16  GLM-4.7-Flash-like (Glm4MoeLiteForCausalLM scaled down): 8 layers,
                              16 heads of multi-head latent attention (q latent 384, kv latent
                              256, 48 + 16 rotated dims, v 64), layer 0 a dense MLP (2816), then
                              16 experts x 512 top-4 by the sigmoid router, renormalised, scale
                              1.8, and a shared expert of 512
    minimax_m2_f32, _bf16     MiniMax-M2-like (MiniMaxM2ForCausalLM scaled down): 8 layers, 16
                              heads / 4 KV heads x 64 with q/k norm over the whole projection,
                              rotary on half of each head, every layer 16 experts x 512 top-4
                              by the sigmoid router (choice bias), renormalised, no shared expert
    llama4_f32, _bf16         Llama-4-Scout-like (Llama4ForCausalLM scaled down): 8 layers, 16
                              heads / 4 KV heads x 64, every 4th layer NoPE, the others RoPE
                              with q/k norm and chunked attention (8192, as released), every
                              layer 16 experts x 512 top-1 (sigmoid of the logit scaling the
                              expert's input) + a shared expert of 512
    gemma3_f32, _bf16         Gemma-3-1B-like (Gemma3ForCausalLM): 8 layers, 4 heads / 1 KV
                              head x 256 with q/k norms, layer 5 full attention, the others a
                              window of 512, sandwich norms, GeGLU of 4096, tied
    mimo_v2_flash_f32, _bf16  MiMo-V2-Flash-like (MiMoV2FlashForCausalLM scaled down): 8 layers,
                              0 and 5 full attention (2 KV heads), the others a window of 128
                              (4 KV heads, sinks), 16 heads of q / k 96 and v 64, layer 0 dense,
                              then 16 experts x 512 top-4 by the sigmoid router, no shared one
    granite_h_f32, _bf16      Granite-4.0-H-Tiny-like (GraniteMoeHybridForCausalLM scaled down): 8
                              layers, 6 Mamba-2 (32 heads x 64, state 128, 1 group, chunk 256) +
                              2 NoPE attention (16 heads / 4 KV heads x 64), each with a shared
                              SwiGLU of 1024 + 16 experts x 512 top-4, Granite's multipliers

Each also as `_f16` (f16 weights: Vicuna / Llama-2-era checkpoints; `--dtypes f16` in
run.sh). Models that already exist (config.json present) are kept. Uses `ModelSpec` and
`build_and_save` of tests/fixtures/make_fixtures.py, with initializer_range 0.02.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

import torch  # noqa: E402

import make_fixtures as mf  # noqa: E402

torch.set_num_threads(2)

COMMON = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    initializer_range=0.02,
    hidden_act="silu",
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)

LLAMA = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    rope_parameters=dict(rope_type="default", rope_theta=500000.0),
)

QWEN3_5 = dict(
    COMMON,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    linear_conv_kernel_dim=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
)


QWEN3_MOE = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    num_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)


GLM4_MOE = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    attention_bias=True,
    use_qk_norm=False,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5),
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.0,
    norm_topk_prob=True,
    first_k_dense_replace=1,
)


GLM4_MOE_LITE = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=384,
    kv_lora_rank=256,
    qk_nope_head_dim=48,
    qk_rope_head_dim=16,
    v_head_dim=64,
    rms_norm_eps=1e-5,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
    mlp_layer_types=["dense"] + ["sparse"] * 7,
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=1.8,
    norm_topk_prob=True,
)


# MiniMax-M2-like: q/k RMSNorm over the whole projection (16 x 64 = 1024 q values), rotary on
# half of each head (rotary_dim 32), 16 experts of 512 top-4 by sigmoid + correction bias,
# renormalised, in every layer, no shared expert.
MINIMAX_M2 = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    rotary_dim=32,
    rope_theta=5000000.0,
    num_local_experts=16,
    num_experts_per_tok=4,
    intermediate_size=512,
)
# Gemma-3-1B-like: 4 heads / 1 KV head x 256 with (1 + w) q/k norms, scores by
# query_pre_attn_scalar 256, every 6th layer full attention (theta 1e6, linear scaling 8 as the
# 4B+ releases), the others a window of 512 keys (theta 1e4), sandwich norms, GeGLU of 4096,
# embeddings x sqrt(1024), tied.
GEMMA3 = dict(
    {k: v for k, v in COMMON.items() if k != "hidden_act"},
    intermediate_size=4096,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    sliding_window=512,
    rope_parameters=dict(
        full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
    ),
    hidden_activation="gelu_pytorch_tanh",
    tie_word_embeddings=True,
)
# Granite-4.0-H-Tiny-like: layers M M M * M M M * (H-Tiny: attention every 10th of 40), Mamba-2
# of 2 x hidden in 32 heads of 64 with state 128 and one group, NoPE attention, a shared SwiGLU
# of 1024 beside 16 experts of 512 top-4 (H-Tiny: 64 x 512 top-6), the released multipliers.
GRANITE_H = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    layer_types=["mamba", "mamba", "mamba", "attention"] * 2,
    intermediate_size=512,
    shared_intermediate_size=1024,
    num_local_experts=16,
    num_experts_per_tok=4,
    position_embedding_type="nope",
    mamba_n_heads=32,
    mamba_d_state=128,
    mamba_n_groups=1,
    mamba_chunk_size=256,
    embedding_multiplier=12.0,
    residual_multiplier=0.22,
    attention_multiplier=0.0078125,
    logits_scaling=6.0,
)
LLAMA4 = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    num_local_experts=16,
    num_experts_per_tok=1,
    intermediate_size=512,
    intermediate_size_mlp=2816,
    interleave_moe_layer_step=1,
)

# MiMo-V2-Flash-like (MiMoV2FlashForCausalLM scaled down): 8 layers, 0 and 5 full attention (2 KV
# heads, theta 5e6), the others a window of 128 keys (4 KV heads, sinks, theta 1e4), 16 heads of
# q / k 96 and v 64 (the release's 3 : 2), values x 0.707, rotary on 32 dims (0.334 of 96); layer
# 0 a dense MLP (2816), then 16 experts x 512 top-4 by the sigmoid router, no shared expert.
MIMO_V2_FLASH = dict(
    COMMON,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=96,
    v_head_dim=64,
    sliding_window=128,
    n_routed_experts=16,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
)


def specs() -> list[mf.ModelSpec]:
    out = []
    for name, model_type, cfg, seed in [
        ("llama", "llama", LLAMA, 501),
        ("qwen3_5", "qwen3_5_text", QWEN3_5, 502),
        ("qwen3_moe", "qwen3_moe", QWEN3_MOE, 503),
        ("glm4_moe", "glm4_moe", GLM4_MOE, 504),
        ("glm4_moe_lite", "glm4_moe_lite", GLM4_MOE_LITE, 505),
        ("minimax_m2", "minimax_m2", MINIMAX_M2, 506),
        ("llama4", "llama4_text", LLAMA4, 507),
        ("gemma3", "gemma3_text", GEMMA3, 508),
        ("granite_h", "granitemoehybrid", GRANITE_H, 509),
        ("mimo_v2_flash", "mimo_v2_flash", MIMO_V2_FLASH, 510),
    ]:
        for dtype, tag in [(torch.float32, "f32"), (torch.bfloat16, "bf16"), (torch.float16, "f16")]:
            out.append(
                mf.ModelSpec(
                    name=f"{name}_{tag}",
                    model_type=model_type,
                    seed=seed,
                    base_config=dict(cfg),
                    weights_dtype=dtype,
                    notes=f"hsx benchmark model ({name}, {tag} weights)",
                )
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="/tmp/hsx-bench/models")
    ap.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    ap.add_argument("--force", action="store_true", help="rebuild models that exist")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    for spec in specs():
        if args.only is not None and spec.name not in args.only:
            continue
        d = root / spec.name
        if (d / "config.json").exists() and not args.force:
            print(f"[{spec.name}] exists: {d}")
            continue
        try:
            mf.build_and_save(spec, d)
        except Exception as e:  # e.g. a transformers without qwen3_5_text
            print(f"[{spec.name}] SKIPPED: cannot build ({type(e).__name__}: {e})")
            continue
        n = sum(f.stat().st_size for f in d.glob("*.safetensors"))
        print(f"[{spec.name}] wrote {d} ({n / 1e6:.0f} MB of weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
