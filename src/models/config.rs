//! `config.json` of a Hugging Face model directory -> [`ModelSpec`].
//!
//! Parsed through `serde_json::Value` so unknown fields (and values such as
//! `{"__float__": "Infinity"}` in unrelated fields) never get in the way. Defaults follow the
//! transformers config classes where a field may be absent.

use std::path::Path;

use serde_json::Value;

use super::ModelError;
pub use super::architecture::Architecture;
pub(super) use super::architecture::{default_eps, default_max_pos, default_theta};
pub use super::cfg::MAX_LAYERS;
pub(super) use super::cfg::{Cfg, shown};
use super::compressed_tensors::Compressed;
use super::fp8_weights::Fp8Blocks;
pub use super::gemma3_config::Gemma3Spec;
pub use super::gemma4_config::{Gemma4Experts, Gemma4Ple, Gemma4Rope, Gemma4Spec};
use super::gpt_oss_config::GptOssSpec;
pub use super::granite_config::GraniteSpec;
use super::hybrid_config::HybridSpec;
pub use super::llama4_config::Llama4Spec;
pub use super::mimo_config::MimoSpec;
pub use super::olmo_config::LayerWindows;
pub use super::qwen4_exp_config::NgramSpec;
use super::weights::Weights;
use crate::kernels::device::{NormKind, QueryTemperature, RowNorm};
pub use crate::kernels::dtype::{RopeScaling, WeightDtype};

/// Everything the engine and the backends need to know about a dense model.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// Model name: the last component of the model directory.
    pub name: String,
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// L, the number of decoder layers (layer ids run 0..=L).
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    /// The epsilon of the decoder's norms (a LayerNorm's where `norm` says so).
    pub rms_norm_eps: f64,
    /// The decoder's norms (the layers' and the final one): RMSNorm, or Cohere's LayerNorm.
    pub norm: NormKind,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// o_proj carries a bias.
    pub o_bias: bool,
    /// gate/up/down projections carry a bias (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm on q and k (before RoPE, but HunYuan's after it).
    pub qk_norm: QkNorm,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub dtype: WeightDtype,
    /// Layer pattern, recurrent-layer and MoE geometry of hybrid and MoE models; `None` for
    /// dense ones (an attention-only MoE model has every layer `Attention`). For hybrids the
    /// attention fields above describe the full-attention layers.
    pub hybrid: Option<HybridSpec>,
    /// Mistral / Mixtral: every attention layer sees keys `pos - window + 1 ..= pos` (a
    /// `sliding_window` smaller than the context; `None`: full causal attention).
    pub sliding_window: Option<usize>,
    /// gpt-oss's windows, sinks and experts; `None` for other architectures.
    pub gpt_oss: Option<GptOssSpec>,
    /// Block-quantized FP8 weights (`quant_method: "fp8"`), dequantized at load to `dtype`.
    pub fp8: Option<Fp8Blocks>,
    /// compressed-tensors' packed integer or float8 weights, dequantized at load to `dtype`.
    pub compressed: Option<Compressed>,
    /// Llama-4's per-layer RoPE, chunks, q/k norm and query temperature; `None` for other
    /// architectures.
    pub llama4: Option<Llama4Spec>,
    /// Gemma-3's sliding / full layers, their RoPEs and score scale; `None` for other
    /// architectures.
    pub gemma3: Option<Gemma3Spec>,
    /// Gemma 4's per-layer attention geometry, RoPEs and MoE block; `None` for other
    /// architectures.
    pub gemma4: Option<Gemma4Spec>,
    /// Per layer: no RoPE (SmolLM3's NoPE layers, every 4th in the releases); `None`: every
    /// layer rotates.
    pub nope_layers: Option<Vec<bool>>,
    /// Per-layer windows and the sliding layers' RoPE (OLMo 2 / 3, EXAONE 4.0, Cohere 2); `None`:
    /// as `sliding_window` says for every layer.
    pub windows: Option<LayerWindows>,
    /// Per layer: its RoPE theta (Granite SWA's `layer_rope_theta`; a layer whose theta is 0
    /// is NoPE, in `nope_layers`); `None`: the spec's (the windows' own on sliding layers).
    pub layer_thetas: Option<Vec<f64>>,
    /// GLM-4's rotated dims of each head (its `partial_rotary_factor`, ½ by default); `None`:
    /// as the hybrid spec says, else the whole head.
    pub rotary_dim: Option<usize>,
    /// RoPE rotates interleaved pairs `(2i, 2i + 1)` of each head (GLM-4, ERNIE 4.5), not its
    /// halves.
    pub interleaved_rope: bool,
    /// One input norm feeds the attention and the MLP, `x += attn(n) + mlp(n)` (StableLM's
    /// `use_parallel_residual`; Cohere's layers always are; GPT-NeoX's, each with its norm).
    pub parallel_residual: bool,
    /// The MLP's GELU is the exact (erf) one, not the tanh one (GPT-NeoX's `hidden_act`).
    pub exact_gelu: bool,
    /// OLMo's `clip_qkv`: q, k and v clamped to `±limit` right after their projection;
    /// `None` for other architectures (OLMoE's, after its q / k norms, is refused).
    pub clip_qkv: Option<f32>,
    /// Granite's embedding, residual and attention multipliers; `None` for other architectures.
    pub granite: Option<GraniteSpec>,
    /// Phi-3's LongRoPE (`longrope` / `su`); `None` for other RoPEs and architectures.
    pub longrope: Option<LongRope>,
    /// Ministral 3 / Devstral 2 and Mistral 4: every attention layer's query scaled by its
    /// position (`llama_4_scaling_beta`); `None` for other architectures.
    pub query_temperature: Option<QueryTemperature>,
    /// Falcon-H1's multipliers; `None` for other architectures.
    pub falcon_h1: Option<super::falcon_h1_config::FalconH1Spec>,
    /// Qwen4-Exp's hyper-connections; `None`: one residual stream.
    pub hyper: Option<HyperSpec>,
    /// Qwen4-Exp's QSA indexer on every attention layer; `None` for other architectures.
    pub qsa: Option<QsaSpec>,
    /// Qwen4-Exp's hashed n-gram embeddings; `None`: no layer has them.
    pub ngram: Option<NgramSpec>,
    /// MiMo-V2-Flash's full and sliding layers, value heads and value scale; `None` for other
    /// architectures.
    pub mimo: Option<MimoSpec>,
    /// AFMoE's sliding / full layers and embedding scale; `None` for other architectures.
    pub afmoe: Option<super::afmoe_config::AfmoeSpec>,
    /// Cohere 2 MoE's shared-expert combination; `None` for other architectures.
    pub cohere: Option<super::cohere_config::CohereSpec>,
    /// LFM2's short convolutions.
    pub lfm2: Option<super::lfm2_config::Lfm2Spec>,
}

/// Qwen4-Exp's QSA indexer (`crate::kernels::qsa`): per query past `budget + ratio - 1`
/// keys, the `budget / ratio` best blocks of `ratio` keys and the incomplete tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QsaSpec {
    /// `indexer_n_heads`, `indexer_head_dim`.
    pub heads: usize,
    pub head_dim: usize,
    pub budget: usize,
    pub ratio: usize,
}

impl QsaSpec {
    /// Queries below this position attend to every key (`budget + ratio - 1`).
    pub fn dense_len(&self) -> usize {
        self.budget + self.ratio - 1
    }
}

/// Hyper-connections: the residual stream is `streams` copies of the hidden width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HyperSpec {
    /// `hc_count`.
    pub streams: usize,
    /// `hc_lowrank`: the rank of each connection's input mix.
    pub rank: usize,
}

/// Phi-3's LongRoPE (`rope_type` `longrope`, which older configs call `su`: Phi-3-mini /
/// medium-128k, Phi-3.5-mini / MoE) as hsx runs it. transformers picks the frequencies by the
/// sequence's length: `short_factor`s up to `original_max_position_embeddings` (the
/// pretraining context), `long_factor`s past it. hsx runs the short ones, so requests up to
/// that length (the model's `max_position_embeddings` in its spec): the length of drafter
/// training data; a longer request is refused, not computed on the wrong frequencies.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRope {
    /// The rotated dims of each head (the first ones): all of it, or Phi-4-mini's
    /// `partial_rotary_factor` of it.
    pub rotary_dim: usize,
    /// Each rotated frequency's divisor (`rotary_dim / 2` of them).
    pub short_factor: Vec<f64>,
    /// The pretraining context, past which transformers takes the long factors.
    pub original_max_position_embeddings: usize,
    /// cos and sin are scaled by it: given, or
    /// `sqrt(1 + ln(factor) / ln(original))` with `factor` = the config's
    /// `max_position_embeddings / original_max_position_embeddings` (1 where that is ≤ 1).
    pub attention_factor: f64,
}

impl ModelSpec {
    /// Values per token of the residual stream, the width of every captured row: the hidden
    /// size, times the streams of hyper-connections.
    pub fn stream_width(&self) -> usize {
        self.hidden_size * self.hyper.map_or(1, |h| h.streams)
    }

    /// `name`'s spec of `architecture` before its config is read: no layers or sizes yet, the
    /// class defaults of eps and context, no biases or q/k norm, and none of the families'
    /// extensions (each config reader fills in what its family has: `..ModelSpec::base(..)`).
    pub(super) fn base(name: String, architecture: Architecture) -> Self {
        Self {
            name,
            architecture,
            vocab_size: 0,
            hidden_size: 0,
            num_layers: 0,
            num_heads: 0,
            num_kv_heads: 0,
            head_dim: 0,
            intermediate_size: 0,
            rms_norm_eps: default_eps(architecture),
            norm: NormKind::Rms,
            rope_theta: default_theta(architecture),
            rope_scaling: RopeScaling::None,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: QkNorm::None,
            tie_word_embeddings: false,
            max_position_embeddings: default_max_pos(architecture),
            dtype: WeightDtype::F32,
            hybrid: None,
            sliding_window: None,
            gpt_oss: None,
            fp8: None,
            compressed: None,
            llama4: None,
            gemma3: None,
            gemma4: None,
            nope_layers: None,
            windows: None,
            layer_thetas: None,
            rotary_dim: None,
            interleaved_rope: false,
            parallel_residual: false,
            exact_gelu: false,
            clip_qkv: None,
            granite: None,
            longrope: None,
            query_temperature: None,
            falcon_h1: None,
            hyper: None,
            qsa: None,
            ngram: None,
            mimo: None,
            afmoe: None,
            cohere: None,
            lfm2: None,
        }
    }

    /// The decoder's norm (pre-norms, post-norms, the final norm).
    pub fn row_norm(&self) -> RowNorm {
        RowNorm {
            kind: self.norm,
            eps: self.rms_norm_eps,
        }
    }

    /// Reads `dir/config.json`. Errors (never panics) on a missing dir/config, an unsupported
    /// architecture or feature, or a missing/invalid field.
    pub fn from_dir(dir: &Path) -> Result<ModelSpec, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::MissingDir(dir.to_path_buf()));
        }
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(ModelError::MissingConfig(path));
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ModelError::Io {
            path: path.clone(),
            source,
        })?;
        let value: Value = super::pyjson::from_str(&text).map_err(|e| ModelError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut spec = Self::from_json(&value, &path, model_name(dir))?;
        if spec.dtype_was_defaulted(&value) {
            spec.dtype = detect_dtype(dir)?;
        }
        Ok(spec)
    }

    /// Parses an already-loaded `config.json` (`path` is only used in errors). When the
    /// config names no dtype, `dtype` is F32 (`from_dir` then asks the weights).
    pub fn from_json(value: &Value, path: &Path, name: String) -> Result<ModelSpec, ModelError> {
        let value = super::export_config::text_model_config(value, path)?;
        let architecture = Cfg::new(&value, path)?.architecture()?;
        let value = super::mistral_config::with_class_rope(value, architecture);
        let value = super::kimi_config::as_deepseek(value, architecture);
        let cfg = Cfg::new(&value, path)?;
        let mut spec = match architecture {
            Architecture::GptOss => super::gpt_oss_config::parse(&cfg, &value, name)?,
            a @ (Architecture::Gemma | Architecture::Gemma2 | Architecture::VaultGemma) => {
                super::gemma3_config::parse_gemma1_2(&cfg, a, name)?
            }
            Architecture::Gemma3 => super::gemma3_config::parse(&cfg, name)?,
            a @ (Architecture::Gemma4 | Architecture::Gemma4Unified) => {
                super::gemma4_config::parse(&cfg, a, name)?
            }
            a @ (Architecture::Olmo2
            | Architecture::Olmo3
            | Architecture::Exaone4
            | Architecture::ExaoneMoe
            | Architecture::FlexOlmo) => super::olmo_config::parse(&cfg, a, name)?,
            Architecture::OlmoHybrid => super::olmo_config::parse_hybrid(&cfg, name)?,
            Architecture::KimiLinear => super::kimi_config::parse(&cfg, name)?,
            a if a.has_latent_attention() => super::deepseek_config::parse(&cfg, a, name)?,
            a if a.is_hybrid() => super::hybrid_config::parse(&cfg, a, name)?,
            Architecture::GraniteMoeHybrid => super::granite_config::parse_hybrid(&cfg, name)?,
            a @ (Architecture::GraniteMoe
            | Architecture::GraniteMoeShared
            | Architecture::GraniteMoeSwa) => super::granite_config::parse_moe(&cfg, a, name)?,
            Architecture::Bamba => super::granite_config::parse_bamba(&cfg, name)?,
            Architecture::Mamba2 => super::mamba2::parse(&cfg, name)?,
            Architecture::Jamba => super::jamba::parse(&cfg, name)?,
            a @ (Architecture::Mamba | Architecture::FalconMamba) => {
                super::mamba::parse(&cfg, name, a)?
            }
            Architecture::FalconH1 => super::falcon_h1_config::parse(&cfg, name)?,
            Architecture::MiMoV2Flash => super::mimo_config::parse(&cfg, name)?,
            Architecture::Afmoe => super::afmoe_config::parse(&cfg, name)?,
            Architecture::Cwm => super::cwm_config::parse(&cfg, name)?,
            Architecture::Ministral => super::mistral_config::parse_ministral(&cfg, name)?,
            Architecture::Starcoder2 => super::starcoder2_config::parse(&cfg, name)?,
            Architecture::StableLm => super::stablelm_config::parse(&cfg, name)?,
            Architecture::Phi => super::phi::parse(&cfg, name)?,
            Architecture::GptNeox => super::gpt_neox::parse(&cfg, name)?,
            Architecture::Olmo => super::olmo1::parse(&cfg, name)?,
            Architecture::Nemotron => super::nemotron::parse(&cfg, name)?,
            Architecture::Jais2 => super::dense_config::parse_jais2(&cfg, name)?,
            Architecture::GraniteSwa => super::granite_config::parse_swa(&cfg, name)?,
            Architecture::Mellum => super::olmo_config::parse_mellum(&cfg, name)?,
            a @ (Architecture::Lfm2 | Architecture::Lfm2Moe | Architecture::Lfm3) => {
                super::lfm2_config::parse(&cfg, a, name)?
            }
            a @ (Architecture::Cohere | Architecture::Cohere2 | Architecture::Cohere2Moe) => {
                super::cohere_config::parse(&cfg, a, name)?
            }
            a => super::dense_config::dense_spec(&cfg, a, name)?,
        };
        spec.fp8 = cfg.fp8_blocks()?;
        spec.compressed = cfg.compressed()?;
        spec.validate(path)?;
        Ok(spec)
    }

    fn dtype_was_defaulted(&self, value: &Value) -> bool {
        let has = |k: &str| value.get(k).is_some_and(|v| !v.is_null());
        !has("torch_dtype") && !has("dtype")
    }

    /// The model has linear-attention or Mamba layers, so every running request needs a
    /// recurrent-state slot.
    /// The rotated dims of each attention head: GLM-4's `rotary_dim`, else the hybrid / MoE
    /// spec's, else the whole head.
    pub fn rotated_dims(&self) -> usize {
        (self.rotary_dim)
            .or(self.hybrid.as_ref().map(|h| h.rotary_dim))
            .unwrap_or(self.head_dim)
    }

    pub fn has_recurrent_layers(&self) -> bool {
        self.hybrid
            .as_ref()
            .is_some_and(|h| h.layers.iter().any(|k| k.is_recurrent()))
    }

    /// Number of query heads sharing one kv head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }
}

/// Where and how the attention's q / k norm applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head on its own (`q_norm` / `k_norm` of `head_dim` values: Qwen3, GLM-4.5).
    PerHead,
    /// The whole projection before it is split into heads (`heads · head_dim` values:
    /// MiniMax-M2's `qk_norm_type` `per_layer`).
    Whole,
    /// Each head on its own after RoPE (`query_layernorm` / `key_layernorm`: HunYuan).
    PerHeadAfterRope,
    /// Each head LayerNormed (no bias) with its own weights, `q_norm` / `k_norm` of
    /// `[heads, head_dim]`: Cohere's `use_qk_norm` (Command R+).
    HeadLayerNorm,
}

fn model_name(dir: &Path) -> String {
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    canonical
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".to_string())
}

/// dtype of the embedding table on disk, for configs that name none (a multimodal export's
/// `model.language_model.embed_tokens` answers to `model.embed_tokens`: `Weights`).
fn detect_dtype(dir: &Path) -> Result<WeightDtype, ModelError> {
    let weights = Weights::open(dir)?;
    let names = ["model.embed_tokens.weight", "backbone.embeddings.weight"];
    let name = names
        .iter()
        .find(|n| weights.contains(n))
        .unwrap_or(&names[0]);
    weights.dtype_of(name)
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
