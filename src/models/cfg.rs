//! Typed reading of a `config.json`'s fields ([`Cfg`]): `null` as absent, counts and floats
//! checked, errors naming the file and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::ModelError;
use super::compressed_tensors::Compressed;
use super::config::{Architecture, RopeScaling, WeightDtype, default_theta};
use super::fp8_weights::Fp8Blocks;

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
    pub(super) fn fp8_blocks(&self) -> Result<Option<Fp8Blocks>, ModelError> {
        match self.get("quantization_config") {
            None => Ok(None),
            Some(q) => super::fp8_weights::fp8_blocks(q, |f, m| self.err(f, m)),
        }
    }

    /// The weights of a compressed-tensors `quantization_config` (`None` for other methods).
    pub(super) fn compressed(&self) -> Result<Option<Compressed>, ModelError> {
        match self.get("quantization_config") {
            None => Ok(None),
            Some(q) => super::compressed_tensors::compressed(q, |f, m| self.err(f, m)),
        }
    }

    pub(super) fn usize_opt(&self, field: &str) -> Result<Option<usize>, ModelError> {
        value_usize(self.get(field)).map_err(|m| self.err(field, m))
    }

    /// `field`, or `default` where absent; 0 is refused by name.
    pub(super) fn positive_or(&self, field: &str, default: usize) -> Result<usize, ModelError> {
        match self.usize_or(field, default)? {
            0 => Err(self.err(field, "0 (must be positive)")),
            v => Ok(v),
        }
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

    /// `field` as a string, `default` where the config names none.
    pub(super) fn str_or(&self, field: &str, default: &'a str) -> Result<&'a str, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => {
                (v.as_str()).ok_or_else(|| self.err(field, format!("expected a string, found {v}")))
            }
        }
    }

    pub(super) fn architecture(&self) -> Result<Architecture, ModelError> {
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

    /// `hidden_act` is one of `names` (or absent: the class's default is the first).
    pub(super) fn check_named_activation(&self, names: &[&str]) -> Result<(), ModelError> {
        match self.get("hidden_act").and_then(|v| v.as_str()) {
            None => Ok(()),
            Some(a) if names.contains(&a) => Ok(()),
            Some(other) => Err(ModelError::Unsupported {
                path: self.path_buf(),
                what: format!(
                    "hidden_act `{other}` (only {} for this architecture)",
                    names.join(" / ")
                ),
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
        let window = match (arch, self.get("sliding_window")) {
            // Dots1Config's default window.
            (Architecture::Dots1, None) => Some(4096),
            _ => self.usize_opt("sliding_window")?,
        };
        let window = window.filter(|&w| w < max_pos);
        let refused = match arch {
            Architecture::Mistral
            | Architecture::Ministral3
            | Architecture::Mixtral
            | Architecture::Phi3
            | Architecture::Starcoder2 => {
                if window == Some(0) {
                    return Err(self.err("sliding_window", "must be at least 1"));
                }
                return Ok(window);
            }
            Architecture::Qwen2
            | Architecture::Qwen2Moe
            | Architecture::Qwen3
            | Architecture::Qwen3Moe => {
                self.bool_or("use_sliding_window", false)? || self.has_sliding_layer_types()
            }
            Architecture::Llama => false,
            // Dots1Config's sliding layers are those from `max_window_layers` (62) on.
            Architecture::Dots1 => {
                let layers = self.num_layers()?;
                self.has_sliding_layer_types() || self.usize_or("max_window_layers", 62)? < layers
            }
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
