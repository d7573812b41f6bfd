//! The decoder families hsx runs and the defaults their config classes give fields a
//! `config.json` may leave out.

/// The decoder families hsx runs: dense, and hybrid (see [`HybridSpec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Mistral,
    /// `Starcoder2ForCausalLM` (StarCoder2 3B / 7B / 15B): Mistral's attention with biases,
    /// LayerNorms with biases, an ungated tanh-GELU MLP (`c_fc`, `c_proj`) with biases.
    Starcoder2,
    /// `GPTNeoXForCausalLM` (Pythia, GPT-NeoX-20B): parallel layers, each sublayer after its
    /// own biased LayerNorm, fused per-head q / k / v, partial rotary, a GELU MLP.
    GptNeox,
    /// `PhiForCausalLM` (phi-1, phi-1.5, phi-2): parallel layers under one biased LayerNorm,
    /// partial rotary, biased projections, a tanh-GELU MLP, an LM head with a bias.
    Phi,
    /// `StableLmForCausalLM` (StableLM 2 1.6B / 12B, StableLM 3B 4E1T, Stable Code 3B): LayerNorms
    /// with biases, partial rotary, optional per-head q / k LayerNorms and parallel residual.
    StableLm,
    /// `GraniteMoeSWAForCausalLM`: GraniteMoeShared's experts behind Granite SWA's attention
    /// (sinks, sliding layers, a RoPE theta per layer).
    GraniteMoeSwa,
    /// `VaultGemmaForCausalLM` (VaultGemma 1B): Gemma-2's layers with each sublayer's input
    /// normed only (no post-norms).
    VaultGemma,
    /// `Jais2ForCausalLM` (Jais 2 8B): Llama's layers with LayerNorms with biases, q / k / v / o
    /// biased, an ungated relu² MLP with biases.
    Jais2,
    /// `MinistralForCausalLM` (Ministral-8B-Instruct-2410 as transformers' class has it):
    /// Mistral's layers, each sliding or full as `layer_types` says.
    Ministral,
    /// `Ministral3ForCausalLM` (Ministral 3, Devstral 2, Devstral Small 2): Mistral's layers,
    /// each query scaled by its position past the original context.
    Ministral3,
    /// `Qwen3_5ForCausalLM` (text model): Gated DeltaNet + gated full attention, dense MLP.
    Qwen3_5,
    /// `Qwen3NextForCausalLM`: Gated DeltaNet + gated full attention, MoE + shared expert.
    Qwen3Next,
    /// `NemotronHForCausalLM`: Mamba-2 / attention / MLP blocks.
    NemotronH,
    /// `Mamba2ForCausalLM` (mamba2-2.7b, Mamba-Codestral-7B): Nemotron-H's blocks, every
    /// mixer Mamba-2.
    Mamba2,
    /// `MambaForCausalLM` (state-spaces/mamba-130m … 2.8b-hf): every block a Mamba-1 mixer.
    Mamba,
    /// `JambaForCausalLM` (Jamba 1.5 / 1.6 / 1.7, Jamba Reasoning 3B): attention and Mamba-1
    /// mixers, each followed by a SwiGLU MLP or a MoE block.
    Jamba,
    /// `FalconMambaForCausalLM` (Falcon-Mamba-7B, Falcon3-Mamba-7B): Mamba-1 with weightless
    /// RMS norms of dt, B and C.
    FalconMamba,
    /// `Qwen3MoeForCausalLM`: Qwen3 attention, routed experts (dense MLPs between them).
    Qwen3Moe,
    /// `MixtralForCausalLM`: Mistral attention, routed experts (`block_sparse_moe`).
    Mixtral,
    /// `Qwen3_5MoeForCausalLM`: Qwen3.5 layers with routed experts + a gated shared expert.
    Qwen3_5Moe,
    /// `Qwen4ExpForCausalLM`: Qwen3.5-MoE's layers between hyper-connections (a residual
    /// stream of `hc_count` copies), QSA indexers on the attention layers.
    Qwen4Exp,
    /// `GptOssForCausalLM`: sinks, sliding / full attention, YaRN, biased MoE (MXFP4 or not).
    GptOss,
    /// `Glm4MoeForCausalLM` (GLM-4.5 / 4.6 / 4.7): biased q/k/v, partial rotary, optional
    /// q/k norm, dense MLPs then routed experts with DeepSeek-V3's router + a shared expert.
    Glm4Moe,
    /// `DeepseekV3ForCausalLM` (DeepSeek-V3 / R1, Kimi-K2, Moonlight): multi-head latent
    /// attention, dense MLPs then DeepSeek-V3's MoE.
    DeepseekV3,
    /// `Glm4MoeLiteForCausalLM` (GLM-4.7-Flash): DeepSeek-V3's multi-head latent attention
    /// and MoE, dense or sparse per layer as `mlp_layer_types` says.
    Glm4MoeLite,
    /// `DeepseekV32ForCausalLM` (DeepSeek-V3.2): DeepSeek-V3 with DeepSeek Sparse Attention (an
    /// indexer picks the `index_topk` keys each query attends over).
    DeepseekV32,
    /// `GlmMoeDsaForCausalLM` (GLM-5): GLM's multi-head latent attention with DeepSeek Sparse
    /// Attention (as [`Self::DeepseekV32`]), DeepSeek-V3's MoE.
    GlmMoeDsa,
    /// `Mistral4ForCausalLM` (Mistral Small 4): DeepSeek-V3's multi-head latent attention with
    /// each query scaled by its position past the original context, DeepSeek-V3's MoE with a
    /// softmax router.
    Mistral4,
    /// `KimiLinearForCausalLM` (Kimi Linear): Kimi Delta Attention layers (a decay per key
    /// channel) and DeepSeek's multi-head latent attention without RoPE, DeepSeek-V3's MoE.
    KimiLinear,
    /// `MiniMaxM2ForCausalLM` (MiniMax-M2 / M2.1 / M2.5): q/k RMSNorm over the whole
    /// projection, partial rotary, every layer routed experts with a sigmoid router and a
    /// correction bias, no shared expert.
    MiniMaxM2,
    /// `Llama4ForCausalLM` (Llama-4 Scout / Maverick's language model): RoPE layers (complex,
    /// interleaved pairs; chunked attention, weightless q/k norm) and NoPE layers (query
    /// temperature), dense MLPs and / or routed experts (top-k of the logits, their sigmoid
    /// scaling each expert's input) + a shared expert.
    Llama4,
    /// `GemmaForCausalLM` (Gemma 1 / 1.1, CodeGemma): Gemma-2's layers without the sandwich's
    /// output norms, windows or soft cap.
    Gemma,
    /// `Gemma2ForCausalLM`: Gemma-3's layers with no q/k norms, one RoPE, alternating
    /// sliding / full attention and tanh soft-capped scores.
    Gemma2,
    /// `Gemma3ForCausalLM` (Gemma-3's language model): sliding-window and full attention
    /// layers with their own RoPE, `(1 + w)` RMSNorms around each sublayer (sandwich), per-head
    /// q/k norms, GeGLU MLPs, embeddings scaled by `√hidden`.
    Gemma3,
    /// `Gemma4ForCausalLM` (Gemma 4 31B / 26B-A4B / E2B / E4B's language model): Gemma-3's sliding /
    /// full layers with plain-weight sandwich norms, full layers with their own head size and
    /// KV heads (values from the keys' projection where `attention_k_eq_v`) and proportional
    /// RoPE, a v norm, unscaled scores, a per-layer output scalar, and optionally a MoE block
    /// beside each dense MLP, per-layer embeddings, KV sharing.
    Gemma4,
    /// `Gemma4UnifiedForCausalLM` (Gemma 4 12B's language model): Gemma 4's layers without
    /// per-layer embeddings or a MoE block (its config class has neither), KV sharing as
    /// Gemma 4's; windows of 1024 and a context of 262,144 by default.
    Gemma4Unified,
    /// `NemotronForCausalLM` (Nemotron-4 Minitron, Nemotron-Mini): Llama's layers with
    /// `LayerNorm1P` norms (`1 + weight`, a bias), partial RoPE, a relu² MLP without a gate.
    Nemotron,
    /// `OlmoForCausalLM` (OLMo 1): Llama's layers with LayerNorms without weights, q / k / v
    /// clamped where `clip_qkv`.
    Olmo,
    /// `Olmo2ForCausalLM` (OLMo 2): Llama's attention and MLP, each sublayer's output RMS-normed
    /// before the residual add and its input not normed, q / k RMSNorm over the whole
    /// projection.
    Olmo2,
    /// `Olmo3ForCausalLM` (OLMo 3): OLMo 2's layers, three of four with a sliding window, each
    /// kind with its RoPE.
    Olmo3,
    /// `Exaone4ForCausalLM` (EXAONE 4.0): OLMo 2's post-norm layers with per-head q / k
    /// norms; with a `sliding_window`, sliding layers with RoPE and full layers without.
    Exaone4,
    /// `OlmoHybridForCausalLM` (OLMo Hybrid): Gated DeltaNet layers (pre-norm; separate
    /// projections, beta in (0, 2)) and, every few layers, OLMo 3's post-norm attention
    /// (without RoPE in the releases).
    OlmoHybrid,
    /// `Glm4ForCausalLM` (GLM-4-0414, GLM-Z1): q / k / v biases, RoPE on half of each head in
    /// interleaved pairs, each sublayer between two RMSNorms, a fused gate / up projection.
    Glm4,
    /// `GlmForCausalLM` (GLM-4-9B / -chat, the 2024 release in transformers' format): GLM-4's
    /// layers without the sandwich's output norms.
    Glm,
    /// `SeedOssForCausalLM` (Seed-OSS-36B): Llama's layers with q / k / v biases and an
    /// optional o_proj bias of its own.
    SeedOss,
    /// `SmolLM3ForCausalLM` (SmolLM3): Llama's layers, NoPE on every `no_rope_layers` 0.
    SmolLM3,
    /// `GraniteForCausalLM` (Granite 3.x): Llama's layers with embedding, residual and
    /// attention multipliers.
    Granite,
    /// `GraniteMoeHybridForCausalLM` (Granite 4.0): Mamba-2 or NoPE / RoPE attention, then a
    /// SwiGLU shared MLP alone or beside routed experts, with Granite's multipliers.
    GraniteMoeHybrid,
    /// `Phi3ForCausalLM` (Phi-3 mini / medium, Phi-4): Llama's layers with a fused
    /// `qkv_proj` and `gate_up_proj`, an optional sliding window.
    Phi3,
    /// `BambaForCausalLM` (Bamba-9B): Mamba-2 mixers and attention layers at
    /// `attn_layer_indices` (RoPE on half of each head), each followed by a SwiGLU MLP.
    Bamba,
    /// `FalconH1ForCausalLM` (Falcon-H1, Falcon-H1R): in every layer a Mamba-2 mixer and
    /// attention side by side on the same normed rows, their outputs summed, then a SwiGLU
    /// MLP; µP multipliers on the embedding, the projections and the mixers' outputs.
    FalconH1,
    /// `MiMoV2FlashForCausalLM` (MiMo-V2-Flash): GQA attention with v heads narrower than q / k,
    /// partial rotary, scaled values; sliding layers (twice the KV heads, learned sinks, their
    /// own RoPE theta) between full ones; DeepSeek-V3's sigmoid-routed experts, no shared one.
    MiMoV2Flash,
    /// `Ernie4_5ForCausalLM` (ERNIE-4.5-0.3B): Llama's layers with RoPE on interleaved pairs.
    Ernie4_5,
    /// `Ernie4_5_MoeForCausalLM` (ERNIE-4.5-21B-A3B / 300B-A47B): ERNIE 4.5's attention,
    /// softmax-routed experts ranked with a correction bias, plain shared experts.
    Ernie4_5Moe,
    /// `Dots1ForCausalLM` (dots.llm1): Qwen3's attention, DeepSeek-V3's sigmoid-routed experts.
    Dots1,
    /// `HunYuanDenseV1ForCausalLM` (Hunyuan-7B and smaller): Llama's layers with per-head q / k
    /// norms after RoPE, NTK-alpha RoPE.
    HunYuanDenseV1,
    /// `HunYuanMoEV1ForCausalLM` (Hunyuan-A13B): HunYuan's attention, softmax-routed experts in
    /// every layer beside a shared MLP.
    HunYuanMoEV1,
    /// `ExaoneMoeForCausalLM` (K-EXAONE): EXAONE 4.0's attention (sliding layers with RoPE,
    /// full ones without) in pre-norm layers, DeepSeek-V3's sigmoid-routed experts.
    ExaoneMoe,
    /// `HYV3ForCausalLM` (Tencent HY V3): Qwen3's attention, a dense first layer, then
    /// sigmoid-routed experts (MiniMax-M2's router with a scaling factor) beside shared experts.
    HyV3,
    /// `Qwen2MoeForCausalLM` (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention, softmax-routed
    /// experts beside a sigmoid-gated shared expert.
    Qwen2Moe,
    /// `OlmoeForCausalLM` (OLMoE): Llama's layers with q / k norms over the whole projection,
    /// softmax-routed experts in every layer.
    Olmoe,
    /// `FlexOlmoForCausalLM` (FlexOlmo): OLMo 2's post-norm layers with OLMoE's experts.
    FlexOlmo,
    /// `AfmoeForCausalLM` (Arcee Trinity): gated attention with per-head q / k norms, sliding
    /// layers with RoPE between full NoPE ones, sandwich norms, sigmoid-routed experts beside
    /// shared ones.
    Afmoe,
    /// `GraniteMoeForCausalLM` (Granite 3.0 / 3.1 MoE): Granite's multipliers, attention and
    /// Granite 4.0's routed experts in every layer.
    GraniteMoe,
    /// `GraniteMoeSharedForCausalLM`: GraniteMoe with Granite 4.0's shared MLP beside them.
    GraniteMoeShared,
    /// `CohereForCausalLM` (Command R, Aya Expanse): LayerNorms without bias, attention and MLP
    /// in parallel from one norm, RoPE on interleaved pairs.
    Cohere,
    /// `Cohere2ForCausalLM` (Command R7B, Command A): Cohere's layers, sliding layers with RoPE
    /// and full ones without.
    Cohere2,
    /// `Cohere2MoeForCausalLM`: Cohere 2's layers with routed experts after dense ones.
    Cohere2Moe,
    /// `SolarOpenForCausalLM` (Solar Open): Llama's attention with GLM-4.5's experts in every
    /// layer.
    SolarOpen,
    /// `AXK1ForCausalLM` (A.X K1): DeepSeek-V3's layers, an RMSNorm on each MoE block's output.
    Axk1,
    /// `HyperCLOVAXForCausalLM` (HyperCLOVA X SEED): Granite's layers with an RMSNorm on each
    /// sublayer's output (Peri-LN).
    HyperClovaX,
    /// `ArceeForCausalLM` (AFM-4.5B): Llama's layers with a non-gated relu² MLP.
    Arcee,
    /// `HeliumForCausalLM` (Helium 1): Llama's layers with RoPE on interleaved pairs.
    Helium,
    /// `CwmForCausalLM` (Code World Model): Llama's layers, three sliding layers of every four.
    Cwm,
    /// `YoutuForCausalLM` (Youtu-LLM): Llama's dense layers with DeepSeek-V3's latent attention.
    Youtu,
    /// `ApertusForCausalLM` (Apertus): Llama's layers with per-head q / k norms and a
    /// non-gated xIELU MLP.
    Apertus,
    /// `GraniteSWAForCausalLM` (Granite SWA): Granite's layers, sliding layers, attention sinks
    /// and a RoPE theta per layer (0: NoPE).
    GraniteSwa,
    /// `MellumForCausalLM` (Mellum): Qwen3-MoE's layers, sliding layers with their own RoPE,
    /// dense layers where `mlp_layer_types` says.
    Mellum,
    /// `Lfm2ForCausalLM` (LFM2): gated short-convolution layers (a conv window their only
    /// state) and attention layers with per-head q / k norms, each followed by a SwiGLU MLP.
    Lfm2,
    /// `Lfm2MoeForCausalLM` (LFM2-MoE): LFM2's layers, dense MLPs then sigmoid-routed experts.
    Lfm2Moe,
    /// `DeepseekV2ForCausalLM` (DeepSeek-V2-Lite, DeepSeek-Coder-V2-Lite): multi-head latent
    /// attention, softmax-routed experts (greedy top-k, never renormalised) beside shared ones.
    DeepseekV2,
    /// `Lfm3ForCausalLM` (LFM3): LFM2's layers with sliding attention layers, each kind's RoPE,
    /// a sigmoid gate per attention head and sandwich norms.
    Lfm3,
}

impl Architecture {
    /// Every architecture, in the order the supported list names them.
    pub const ALL: [Self; 85] = [
        Self::Llama,
        Self::Qwen2,
        Self::Qwen3,
        Self::Mistral,
        Self::Ministral3,
        Self::Ministral,
        Self::Starcoder2,
        Self::Jais2,
        Self::VaultGemma,
        Self::GraniteMoeSwa,
        Self::StableLm,
        Self::Phi,
        Self::SmolLM3,
        Self::Arcee,
        Self::Helium,
        Self::Cwm,
        Self::Apertus,
        Self::SeedOss,
        Self::Glm4,
        Self::Glm,
        Self::Nemotron,
        Self::Olmo,
        Self::Olmo2,
        Self::Olmo3,
        Self::Exaone4,
        Self::OlmoHybrid,
        Self::Lfm2,
        Self::Lfm2Moe,
        Self::Lfm3,
        Self::Qwen3_5,
        Self::Qwen3Next,
        Self::NemotronH,
        Self::Mamba2,
        Self::Mamba,
        Self::FalconMamba,
        Self::Jamba,
        Self::GptNeox,
        Self::Qwen3Moe,
        Self::Mellum,
        Self::Mixtral,
        Self::Qwen3_5Moe,
        Self::Qwen4Exp,
        Self::GptOss,
        Self::Glm4Moe,
        Self::SolarOpen,
        Self::DeepseekV2,
        Self::DeepseekV3,
        Self::Axk1,
        Self::Youtu,
        Self::Glm4MoeLite,
        Self::DeepseekV32,
        Self::GlmMoeDsa,
        Self::Mistral4,
        Self::KimiLinear,
        Self::MiniMaxM2,
        Self::MiMoV2Flash,
        Self::Ernie4_5,
        Self::Ernie4_5Moe,
        Self::Dots1,
        Self::HunYuanDenseV1,
        Self::HunYuanMoEV1,
        Self::ExaoneMoe,
        Self::HyV3,
        Self::Qwen2Moe,
        Self::Olmoe,
        Self::FlexOlmo,
        Self::Afmoe,
        Self::GraniteMoe,
        Self::GraniteMoeShared,
        Self::Cohere2Moe,
        Self::Llama4,
        Self::Gemma,
        Self::Gemma2,
        Self::Gemma3,
        Self::Gemma4,
        Self::Gemma4Unified,
        Self::Granite,
        Self::GraniteSwa,
        Self::HyperClovaX,
        Self::GraniteMoeHybrid,
        Self::Bamba,
        Self::FalconH1,
        Self::Phi3,
        Self::Cohere,
        Self::Cohere2,
    ];

    pub(super) fn from_hf(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.hf_name() == name)
    }

    /// The class name as written in `config.json`'s `architectures`.
    pub fn hf_name(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Mistral => "MistralForCausalLM",
            Self::Ministral3 => "Ministral3ForCausalLM",
            Self::Ministral => "MinistralForCausalLM",
            Self::Starcoder2 => "Starcoder2ForCausalLM",
            Self::Jais2 => "Jais2ForCausalLM",
            Self::VaultGemma => "VaultGemmaForCausalLM",
            Self::GraniteMoeSwa => "GraniteMoeSWAForCausalLM",
            Self::StableLm => "StableLmForCausalLM",
            Self::Phi => "PhiForCausalLM",
            Self::SmolLM3 => "SmolLM3ForCausalLM",
            Self::SeedOss => "SeedOssForCausalLM",
            Self::Glm4 => "Glm4ForCausalLM",
            Self::Glm => "GlmForCausalLM",
            Self::Nemotron => "NemotronForCausalLM",
            Self::Olmo => "OlmoForCausalLM",
            Self::Olmo2 => "Olmo2ForCausalLM",
            Self::Olmo3 => "Olmo3ForCausalLM",
            Self::Exaone4 => "Exaone4ForCausalLM",
            Self::OlmoHybrid => "OlmoHybridForCausalLM",
            Self::Qwen3_5 => "Qwen3_5ForCausalLM",
            Self::Qwen3Next => "Qwen3NextForCausalLM",
            Self::NemotronH => "NemotronHForCausalLM",
            Self::Mamba2 => "Mamba2ForCausalLM",
            Self::Mamba => "MambaForCausalLM",
            Self::FalconMamba => "FalconMambaForCausalLM",
            Self::Jamba => "JambaForCausalLM",
            Self::GptNeox => "GPTNeoXForCausalLM",
            Self::Qwen3Moe => "Qwen3MoeForCausalLM",
            Self::Mixtral => "MixtralForCausalLM",
            Self::Qwen3_5Moe => "Qwen3_5MoeForCausalLM",
            Self::Qwen4Exp => "Qwen4ExpForCausalLM",
            Self::GptOss => "GptOssForCausalLM",
            Self::Glm4Moe => "Glm4MoeForCausalLM",
            Self::DeepseekV2 => "DeepseekV2ForCausalLM",
            Self::DeepseekV3 => "DeepseekV3ForCausalLM",
            Self::Glm4MoeLite => "Glm4MoeLiteForCausalLM",
            Self::DeepseekV32 => "DeepseekV32ForCausalLM",
            Self::GlmMoeDsa => "GlmMoeDsaForCausalLM",
            Self::Mistral4 => "Mistral4ForCausalLM",
            Self::KimiLinear => "KimiLinearForCausalLM",
            Self::MiniMaxM2 => "MiniMaxM2ForCausalLM",
            Self::Llama4 => "Llama4ForCausalLM",
            Self::Gemma => "GemmaForCausalLM",
            Self::Gemma2 => "Gemma2ForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
            Self::Gemma4 => "Gemma4ForCausalLM",
            Self::Gemma4Unified => "Gemma4UnifiedForCausalLM",
            Self::Granite => "GraniteForCausalLM",
            Self::GraniteMoeHybrid => "GraniteMoeHybridForCausalLM",
            Self::Bamba => "BambaForCausalLM",
            Self::FalconH1 => "FalconH1ForCausalLM",
            Self::Phi3 => "Phi3ForCausalLM",
            Self::MiMoV2Flash => "MiMoV2FlashForCausalLM",
            Self::Ernie4_5 => "Ernie4_5ForCausalLM",
            Self::Ernie4_5Moe => "Ernie4_5_MoeForCausalLM",
            Self::Dots1 => "Dots1ForCausalLM",
            Self::HunYuanDenseV1 => "HunYuanDenseV1ForCausalLM",
            Self::HunYuanMoEV1 => "HunYuanMoEV1ForCausalLM",
            Self::ExaoneMoe => "ExaoneMoeForCausalLM",
            Self::HyV3 => "HYV3ForCausalLM",
            Self::Qwen2Moe => "Qwen2MoeForCausalLM",
            Self::Olmoe => "OlmoeForCausalLM",
            Self::FlexOlmo => "FlexOlmoForCausalLM",
            Self::Afmoe => "AfmoeForCausalLM",
            Self::GraniteMoe => "GraniteMoeForCausalLM",
            Self::GraniteMoeShared => "GraniteMoeSharedForCausalLM",
            Self::Cohere => "CohereForCausalLM",
            Self::Cohere2 => "Cohere2ForCausalLM",
            Self::Cohere2Moe => "Cohere2MoeForCausalLM",
            Self::SolarOpen => "SolarOpenForCausalLM",
            Self::Axk1 => "AXK1ForCausalLM",
            Self::HyperClovaX => "HyperCLOVAXForCausalLM",
            Self::Arcee => "ArceeForCausalLM",
            Self::Helium => "HeliumForCausalLM",
            Self::Cwm => "CwmForCausalLM",
            Self::Youtu => "YoutuForCausalLM",
            Self::Apertus => "ApertusForCausalLM",
            Self::Lfm2 => "Lfm2ForCausalLM",
            Self::Lfm2Moe => "Lfm2MoeForCausalLM",
            Self::Lfm3 => "Lfm3ForCausalLM",
            Self::GraniteSwa => "GraniteSWAForCausalLM",
            Self::Mellum => "MellumForCausalLM",
        }
    }

    /// Hybrid families (recurrent layers next to attention).
    pub fn is_hybrid(self) -> bool {
        matches!(
            self,
            Self::Qwen3_5 | Self::Qwen3Next | Self::Qwen3_5Moe | Self::Qwen4Exp | Self::NemotronH
        )
    }

    /// Families whose attention is multi-head latent attention (DeepSeek-V3's).
    pub fn has_latent_attention(self) -> bool {
        matches!(
            self,
            Self::DeepseekV3
                | Self::DeepseekV2
                | Self::Axk1
                | Self::Youtu
                | Self::Glm4MoeLite
                | Self::Mistral4
                | Self::DeepseekV32
                | Self::GlmMoeDsa
        )
    }

    /// transformers' load-time renamings of this family's released tensor names (a part of
    /// the name, then what replaces it): hsx's loaders read the replaced (in-memory) names,
    /// which a checkpoint saved by transformers also has (AFMoE's: the names hsx's shared MoE
    /// loader reads for what it stores under its own).
    pub fn released_renames(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Self::Ernie4_5Moe => &[("mlp.moe_statics.", "mlp.gate.moe_statics.")],
            Self::ExaoneMoe => &[(
                "mlp.e_score_correction_bias",
                "mlp.gate.e_score_correction_bias",
            )],
            Self::HyV3 => &[
                ("mlp.router.gate.", "mlp.gate."),
                ("mlp.expert_bias", "mlp.e_score_correction_bias"),
                ("mlp.shared_mlp.", "mlp.shared_experts."),
            ],
            // Not transformers' renaming (its names are these): the router and its bias where
            // hsx's MoE loader reads a sigmoid router's.
            // The MoE output norm, released beside the block.
            Self::Axk1 => &[(".post_mlp_layernorm.", ".mlp.post_mlp_layernorm.")],
            Self::Afmoe => &[
                ("mlp.router.gate.", "mlp.gate."),
                ("mlp.expert_bias", "mlp.e_score_correction_bias"),
            ],
            _ => &[],
        }
    }

    /// Families with DeepSeek Sparse Attention's indexer (DeepSeek-V3.2, GLM-5).
    pub fn has_sparse_attention(self) -> bool {
        matches!(self, Self::DeepseekV32 | Self::GlmMoeDsa)
    }
}

pub(super) fn default_max_pos(arch: Architecture) -> usize {
    match arch {
        Architecture::Llama | Architecture::Granite | Architecture::GraniteMoeHybrid => 2048,
        Architecture::HyperClovaX | Architecture::Arcee => 2048,
        Architecture::Helium | Architecture::Starcoder2 | Architecture::StableLm => 4096,
        Architecture::Jais2 => 8192,
        Architecture::Phi | Architecture::GptNeox => 2048,
        Architecture::Apertus => 65536,
        Architecture::Lfm2 | Architecture::Lfm2Moe | Architecture::Lfm3 => 128000,
        Architecture::Cwm | Architecture::Youtu => 131072,
        Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Exaone4 => 2048,
        Architecture::Olmo => 2048,
        Architecture::Nemotron => 4096,
        Architecture::ExaoneMoe => 2048,
        Architecture::HyV3 => 131072,
        Architecture::Qwen2Moe => 32768,
        Architecture::Olmoe | Architecture::FlexOlmo => 4096,
        Architecture::Afmoe => 16384,
        Architecture::GraniteMoe | Architecture::GraniteMoeShared => 2048,
        Architecture::GraniteMoeSwa => 2048,
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::SmolLM3 => 32768,
        Architecture::Mistral | Architecture::Mixtral | Architecture::Ministral => 4096 * 32,
        Architecture::Qwen3_5 | Architecture::Qwen3Next | Architecture::Qwen3_5Moe => 32768,
        Architecture::Qwen4Exp => 32768,
        Architecture::Qwen3Moe => 32768,
        Architecture::NemotronH | Architecture::DeepseekV3 => 4096,
        // Mamba(2)Config has no `max_position_embeddings`: positions do not limit a recurrence.
        Architecture::Mamba2 | Architecture::Mamba | Architecture::FalconMamba => 1 << 20,
        Architecture::Jamba => 262144,
        Architecture::DeepseekV2 => 2048,
        Architecture::Axk1 => 32768,
        Architecture::GptOss | Architecture::Glm4Moe | Architecture::Glm4 => 131072,
        Architecture::Glm => 131072,
        Architecture::SolarOpen | Architecture::Mellum => 131072,
        Architecture::MiMoV2Flash => 131072,
        Architecture::Glm4MoeLite | Architecture::GlmMoeDsa => 202752,
        Architecture::DeepseekV32 => 163840,
        Architecture::Mistral4 | Architecture::KimiLinear => 1048576,
        Architecture::MiniMaxM2 => 196608,
        Architecture::Llama4 | Architecture::Gemma3 => 131072,
        Architecture::Bamba | Architecture::Ministral3 => 262144,
        Architecture::Gemma4 => 131072,
        Architecture::Gemma4Unified => 262144,
        Architecture::OlmoHybrid => 65536,
        Architecture::SeedOss => 524288,
        Architecture::Phi3 => 4096,
        Architecture::FalconH1 | Architecture::GraniteSwa => 8192,
        Architecture::Gemma | Architecture::Gemma2 | Architecture::VaultGemma => 8192,
        Architecture::Cohere | Architecture::Cohere2 | Architecture::Cohere2Moe => 8192,
        Architecture::Ernie4_5 | Architecture::Ernie4_5Moe => 131072,
        Architecture::Dots1 | Architecture::HunYuanDenseV1 | Architecture::HunYuanMoEV1 => 2048,
    }
}

/// `rms_norm_eps` when the config names none (MixtralConfig's is 1e-5).
pub(super) fn default_eps(arch: Architecture) -> f64 {
    match arch {
        Architecture::Mixtral | Architecture::Glm4Moe | Architecture::Llama4 => 1e-5,
        Architecture::SolarOpen | Architecture::Arcee | Architecture::Cwm => 1e-5,
        Architecture::Apertus | Architecture::GraniteSwa => 1e-5,
        Architecture::Helium => 1e-8,
        Architecture::Bamba | Architecture::Phi3 | Architecture::Ministral3 => 1e-5,
        Architecture::FalconH1 | Architecture::MiMoV2Flash => 1e-5,
        Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Exaone4 => 1e-5,
        Architecture::ExaoneMoe | Architecture::HyV3 | Architecture::Olmoe => 1e-5,
        Architecture::Afmoe => 1e-5,
        // Lfm2Config's `norm_eps` (read under that name).
        Architecture::Lfm2 | Architecture::Lfm2Moe | Architecture::Lfm3 => 1e-5,
        // CohereConfig's `layer_norm_eps` (read under that name).
        Architecture::Cohere | Architecture::Cohere2 | Architecture::Cohere2Moe => 1e-5,
        Architecture::Ernie4_5 | Architecture::Ernie4_5Moe => 1e-5,
        Architecture::HunYuanDenseV1 | Architecture::HunYuanMoEV1 => 1e-5,
        // Glm4Config's and GlmConfig's 1.5625e-7.
        Architecture::Glm4 | Architecture::Glm => 0.00000015625,
        _ => 1e-6,
    }
}

/// `rope_theta` when the config names none (the config class's `default_theta`).
pub(super) fn default_theta(arch: Architecture) -> f64 {
    match arch {
        Architecture::Mixtral | Architecture::SolarOpen | Architecture::Cwm => 1e6,
        Architecture::Helium => 1e5,
        Architecture::Lfm2 | Architecture::Lfm2Moe | Architecture::Lfm3 => 1e6,
        Architecture::GptOss => 150000.0,
        // MiMoV2FlashConfig's full-attention layers (its sliding ones: 1e4).
        Architecture::MiniMaxM2 | Architecture::MiMoV2Flash => 5e6,
        Architecture::SmolLM3 => 2e6,
        Architecture::HyV3 => 11_158_840.0,
        Architecture::FlexOlmo => 5e5,
        Architecture::Olmo3 => 5e5,
        Architecture::Llama4 => 5e5,
        // Gemma3TextConfig's full-attention layers (its sliding ones: 1e4).
        Architecture::Gemma3 => 1e6,
        // Gemma4TextConfig's default rope_parameters: full 1e6, sliding 1e4 (read per kind).
        Architecture::Gemma4 | Architecture::Gemma4Unified => 1e6,
        _ => 10000.0,
    }
}
