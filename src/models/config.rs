//! `config.json` of a Hugging Face model directory -> [`ModelSpec`].
//!
//! Parsed through `serde_json::Value` so unknown fields (and values such as
//! `{"__float__": "Infinity"}` in unrelated fields) never get in the way. Defaults follow the
//! transformers config classes where a field may be absent.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::ModelError;
pub use super::architecture::Architecture;
pub(super) use super::architecture::{default_eps, default_max_pos, default_theta};
use super::fp8_weights::Fp8Blocks;
pub use super::gemma3_config::Gemma3Spec;
pub use super::gemma4_config::{Gemma4Experts, Gemma4Ple, Gemma4Rope, Gemma4Spec};
use super::gpt_oss_config::GptOssSpec;
pub use super::granite_config::GraniteSpec;
use super::hybrid_config::HybridSpec;
pub use super::llama4_config::Llama4Spec;
pub use super::olmo_config::OlmoSpec;
use super::weights::Weights;
use crate::kernels::device::QueryTemperature;
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
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// o_proj carries a bias.
    pub o_bias: bool,
    /// gate/up/down projections carry a bias (Llama `mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm on q and k before RoPE.
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
    /// OLMo 2 / 3's per-layer windows and the sliding layers' RoPE; `None` for other
    /// architectures.
    pub olmo: Option<OlmoSpec>,
    /// GLM-4's rotated dims of each head (its `partial_rotary_factor`, ½ by default); `None`:
    /// as the hybrid spec says, else the whole head.
    pub rotary_dim: Option<usize>,
    /// Granite's embedding, residual and attention multipliers; `None` for other architectures.
    pub granite: Option<GraniteSpec>,
    /// Phi-3's LongRoPE (`longrope` / `su`); `None` for other RoPEs and architectures.
    pub longrope: Option<LongRope>,
    /// Ministral 3 / Devstral 2 and Mistral 4: every attention layer's query scaled by its
    /// position (`llama_4_scaling_beta`); `None` for other architectures.
    pub query_temperature: Option<QueryTemperature>,
    /// Falcon-H1's multipliers; `None` for other architectures.
    pub falcon_h1: Option<super::falcon_h1_config::FalconH1Spec>,
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
            llama4: None,
            gemma3: None,
            gemma4: None,
            nope_layers: None,
            olmo: None,
            rotary_dim: None,
            granite: None,
            longrope: None,
            query_temperature: None,
            falcon_h1: None,
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
            Architecture::Gemma3 => super::gemma3_config::parse(&cfg, name)?,
            a @ (Architecture::Gemma4 | Architecture::Gemma4Unified) => {
                super::gemma4_config::parse(&cfg, a, name)?
            }
            a @ (Architecture::Olmo2 | Architecture::Olmo3 | Architecture::Exaone4) => {
                super::olmo_config::parse(&cfg, a, name)?
            }
            Architecture::OlmoHybrid => super::olmo_config::parse_hybrid(&cfg, name)?,
            Architecture::KimiLinear => super::kimi_config::parse(&cfg, name)?,
            a if a.has_latent_attention() => super::deepseek_config::parse(&cfg, a, name)?,
            a if a.is_hybrid() => super::hybrid_config::parse(&cfg, a, name)?,
            Architecture::GraniteMoeHybrid => super::granite_config::parse_hybrid(&cfg, name)?,
            Architecture::Bamba => super::granite_config::parse_bamba(&cfg, name)?,
            Architecture::FalconH1 => super::falcon_h1_config::parse(&cfg, name)?,
            a => super::dense_config::dense_spec(&cfg, a, name)?,
        };
        spec.fp8 = cfg.fp8_blocks()?;
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

/// Where the attention's q / k RMSNorm applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head on its own (`q_norm` / `k_norm` of `head_dim` values: Qwen3, GLM-4.5).
    PerHead,
    /// The whole projection before it is split into heads (`heads · head_dim` values:
    /// MiniMax-M2's `qk_norm_type` `per_layer`).
    Whole,
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

/// Most decoder layers a config may claim (released models have at most a few hundred).
pub const MAX_LAYERS: usize = 1 << 16;

/// Typed access to the top-level object of `config.json`. `null` counts as absent.
pub(super) struct Cfg<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
}

impl<'a> Cfg<'a> {
    pub(super) fn new(value: &'a Value, path: &'a Path) -> Result<Self, ModelError> {
        match value.as_object() {
            Some(map) => Ok(Self { map, path }),
            None => Err(ModelError::Json {
                path: path.to_path_buf(),
                message: "top level is not an object".into(),
            }),
        }
    }

    pub(super) fn err(&self, field: &str, message: impl Into<String>) -> ModelError {
        ModelError::Field {
            path: self.path.to_path_buf(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    pub(super) fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    pub(super) fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// The config names `field`, null included (where null means something else than absent).
    pub(super) fn has(&self, field: &str) -> bool {
        self.map.contains_key(field)
    }

    /// The config names `field` as null (which [`Cfg::get`] reads as absent).
    pub(super) fn is_null(&self, field: &str) -> bool {
        self.map.get(field).is_some_and(Value::is_null)
    }

    /// The FP8 blocks of `quantization_config` (`None` when not `fp8`).
    fn fp8_blocks(&self) -> Result<Option<Fp8Blocks>, ModelError> {
        match self.get("quantization_config") {
            None => Ok(None),
            Some(q) => super::fp8_weights::fp8_blocks(q, |f, m| self.err(f, m)),
        }
    }

    pub(super) fn usize_opt(&self, field: &str) -> Result<Option<usize>, ModelError> {
        value_usize(self.get(field)).map_err(|m| self.err(field, m))
    }

    pub(super) fn usize_req(&self, field: &str) -> Result<usize, ModelError> {
        self.usize_opt(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }

    /// `num_hidden_layers`, bounded: per-layer lists (layer kinds, sparse flags) are made from
    /// it before any weight can contradict it.
    pub(super) fn num_layers(&self) -> Result<usize, ModelError> {
        self.num_layers_of(self.usize_req("num_hidden_layers")?)
    }

    /// [`Cfg::num_layers`] with the config class's `default` where the config names none.
    pub(super) fn num_layers_or(&self, default: usize) -> Result<usize, ModelError> {
        self.num_layers_of(self.usize_or("num_hidden_layers", default)?)
    }

    fn num_layers_of(&self, n: usize) -> Result<usize, ModelError> {
        if n > MAX_LAYERS {
            return Err(self.err(
                "num_hidden_layers",
                format!("{n} is more than hsx accepts ({MAX_LAYERS})"),
            ));
        }
        Ok(n)
    }

    pub(super) fn usize_or(&self, field: &str, default: usize) -> Result<usize, ModelError> {
        Ok(self.usize_opt(field)?.unwrap_or(default))
    }

    pub(super) fn f64_or(&self, field: &str, default: f64) -> Result<f64, ModelError> {
        value_f64(self.get(field))
            .map(|v| v.unwrap_or(default))
            .map_err(|m| self.err(field, m))
    }

    pub(super) fn bool_or(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.err(field, format!("expected a boolean, found {v}"))),
        }
    }

    fn architecture(&self) -> Result<Architecture, ModelError> {
        let name = self
            .get("architectures")
            .and_then(|v| v.as_array())
            .and_then(|a| a.first())
            .and_then(|v| v.as_str())
            .ok_or_else(|| self.err("architectures", "missing (expected a list of class names)"))?;
        Architecture::from_hf(name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            path: self.path_buf(),
            name: name.to_string(),
        })
    }

    pub(super) fn check_activation(&self) -> Result<(), ModelError> {
        match self.get("hidden_act").and_then(|v| v.as_str()) {
            None | Some("silu") | Some("swish") => Ok(()),
            Some(other) => Err(ModelError::Unsupported {
                path: self.path_buf(),
                what: format!("hidden_act `{other}` (only silu)"),
            }),
        }
    }

    pub(super) fn dtype(&self) -> Result<Option<WeightDtype>, ModelError> {
        for field in ["dtype", "torch_dtype"] {
            if let Some(v) = self.get(field) {
                let name = v
                    .as_str()
                    .ok_or_else(|| self.err(field, "expected a string"))?;
                return WeightDtype::from_torch_name(name).map(Some).ok_or_else(|| {
                    self.err(
                        field,
                        format!("unsupported dtype `{name}` (float32, bfloat16, float16)"),
                    )
                });
            }
        }
        Ok(None)
    }

    /// The sliding window of every layer: Mistral's, Mixtral's and Phi-3's `sliding_window` when
    /// it is smaller than the context (transformers masks keys older than `pos - window + 1` there).
    /// Qwen2/3's `use_sliding_window` / sliding `layer_types` (windows on some layers only,
    /// off in every released config) are refused.
    pub(super) fn sliding_window(
        &self,
        arch: Architecture,
        max_pos: usize,
    ) -> Result<Option<usize>, ModelError> {
        let window = self.usize_opt("sliding_window")?.filter(|&w| w < max_pos);
        let refused = match arch {
            Architecture::Mistral
            | Architecture::Ministral3
            | Architecture::Mixtral
            | Architecture::Phi3 => {
                if window == Some(0) {
                    return Err(self.err("sliding_window", "must be at least 1"));
                }
                return Ok(window);
            }
            Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe => {
                self.bool_or("use_sliding_window", false)? || self.has_sliding_layer_types()
            }
            Architecture::Llama => false,
            // Hybrid configs are checked in `hybrid_config`.
            _ => self.bool_or("use_sliding_window", false)?,
        };
        if let Some(w) = window.filter(|_| refused) {
            return Err(ModelError::Unsupported {
                path: self.path_buf(),
                what: format!(
                    "sliding-window attention (sliding_window {w} < max_position_embeddings {max_pos})"
                ),
            });
        }
        Ok(None)
    }

    fn has_sliding_layer_types(&self) -> bool {
        self.get("layer_types")
            .and_then(|v| v.as_array())
            .is_some_and(|a| a.iter().any(|t| t.as_str() == Some("sliding_attention")))
    }

    /// The RoPE parameter object and the field it is at: transformers 5.x `rope_parameters`,
    /// else the older `rope_scaling`; `None` where the config names neither.
    pub(super) fn rope_object(&self) -> Option<(&'static str, &'a Value)> {
        match self.get("rope_parameters") {
            Some(p) => Some(("rope_parameters", p)),
            None => self.get("rope_scaling").map(|p| ("rope_scaling", p)),
        }
    }

    /// (theta, scaling) from transformers 5.x `rope_parameters` or the older top-level
    /// `rope_theta` + `rope_scaling`; theta `default_theta(arch)` where neither names one.
    pub(super) fn rope(&self, arch: Architecture) -> Result<(f64, RopeScaling), ModelError> {
        let top_theta = self.f64_or("rope_theta", default_theta(arch))?;
        let Some((field, params)) = self.rope_object() else {
            return Ok((top_theta, RopeScaling::None));
        };
        self.rope_params(field, params, top_theta)
    }

    /// (theta, scaling) of one RoPE parameter object `params` (found at `field`; theta
    /// `top_theta` where it names none).
    pub(super) fn rope_params(
        &self,
        field: &str,
        params: &Value,
        top_theta: f64,
    ) -> Result<(f64, RopeScaling), ModelError> {
        let obj = params
            .as_object()
            .ok_or_else(|| self.err(field, "expected an object"))?;
        let sub = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let sub_f64 = |k: &str| value_f64(sub(k)).map_err(|m| self.err(&format!("{field}.{k}"), m));
        let theta = sub_f64("rope_theta")?.unwrap_or(top_theta);
        let kind = sub("rope_type")
            .or_else(|| sub("type"))
            .and_then(|v| v.as_str())
            .unwrap_or("default");
        match kind {
            "default" => Ok((theta, RopeScaling::None)),
            "llama3" => {
                let req = |k: &str| {
                    sub_f64(k)?
                        .ok_or_else(|| self.err(&format!("{field}.{k}"), "missing (llama3 rope)"))
                };
                let scaling = RopeScaling::Llama3 {
                    factor: req("factor")?,
                    low_freq_factor: req("low_freq_factor")?,
                    high_freq_factor: req("high_freq_factor")?,
                    original_max_position_embeddings: req("original_max_position_embeddings")?,
                };
                Ok((theta, scaling))
            }
            "yarn" => Ok((theta, self.yarn(field, obj)?)),
            "linear" => {
                let factor = sub_f64("factor")?
                    .ok_or_else(|| self.err(&format!("{field}.factor"), "missing (linear rope)"))?;
                if !(factor.is_finite() && factor > 0.0) {
                    return Err(self.err(&format!("{field}.factor"), format!("{factor} (above 0)")));
                }
                Ok((theta, RopeScaling::Linear { factor }))
            }
            other => Err(ModelError::Unsupported {
                path: self.path_buf(),
                what: format!(
                    "{field}: rope type `{other}` (only `default`, `linear`, `llama3` and `yarn`)"
                ),
            }),
        }
    }
}

impl Cfg<'_> {
    /// YaRN parameters with transformers' defaults (`beta_fast` 32, `beta_slow` 1,
    /// `truncate` true) and its attention factor: given, or `0.1 · mscale · ln(factor) + 1`
    /// (the ratio of two such with `mscale` / `mscale_all_dim`).
    fn yarn(&self, field: &str, obj: &Map<String, Value>) -> Result<RopeScaling, ModelError> {
        let sub = |k: &str| obj.get(k).filter(|v| !v.is_null());
        let num = |k: &str| value_f64(sub(k)).map_err(|m| self.err(&format!("{field}.{k}"), m));
        let req = |k: &str| {
            num(k)?.ok_or_else(|| self.err(&format!("{field}.{k}"), "missing (yarn rope)"))
        };
        let factor = req("factor")?;
        let truncate = match sub("truncate") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(self.err(
                    &format!("{field}.truncate"),
                    format!("expected a boolean, found {}", shown(v)),
                ));
            }
        };
        let mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        // Python's `x or default`: a zero counts as absent.
        let nonzero = |k: &str| Ok::<_, ModelError>(num(k)?.filter(|&v| v != 0.0));
        let attention_factor = match (
            num("attention_factor")?,
            nonzero("mscale")?,
            nonzero("mscale_all_dim")?,
        ) {
            (Some(a), _, _) => a,
            (None, Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
            _ => mscale(factor, 1.0),
        };
        let scaling = RopeScaling::Yarn {
            factor,
            beta_fast: nonzero("beta_fast")?.unwrap_or(32.0),
            beta_slow: nonzero("beta_slow")?.unwrap_or(1.0),
            original_max_position_embeddings: req("original_max_position_embeddings")?,
            truncate,
            attention_factor,
        };
        let ok = [factor, attention_factor]
            .iter()
            .all(|v| v.is_finite() && *v > 0.0);
        if !ok {
            return Err(self.err(
                field,
                format!("invalid yarn factors {factor} / {attention_factor}"),
            ));
        }
        Ok(scaling)
    }
}

fn value_usize(v: Option<&Value>) -> Result<Option<usize>, String> {
    match v {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) => usize::try_from(n)
                .map(Some)
                .map_err(|_| format!("{n} is too large")),
            None => Err(format!(
                "expected a non-negative integer, found {}",
                shown(v)
            )),
        },
    }
}

fn value_f64(v: Option<&Value>) -> Result<Option<f64>, String> {
    match v {
        None => Ok(None),
        Some(v) => super::pyjson::value_f64(v)
            .map(Some)
            .ok_or_else(|| format!("expected a number, found {}", shown(v))),
    }
}

/// A value as quoted in an error: cut to 200 characters.
pub(super) fn shown(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s,
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
