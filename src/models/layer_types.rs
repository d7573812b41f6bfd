//! `layer_types`: the per-layer list transformers' configs use to say what each decoder layer
//! is. Two vocabularies occur: windows (`sliding_attention` / `full_attention`: gpt-oss,
//! Gemma 3 and 4, OLMo 3, EXAONE 4) and mixers (`linear_attention` / `full_attention`: Qwen3.5,
//! Qwen3-Next, OLMo Hybrid, Kimi Linear). One parser per vocabulary, shared by every family.

use serde_json::Value;

use super::ModelError;
use super::config::{Cfg, shown};
use super::hybrid_config::LayerKind;

const FIELD: &str = "layer_types";

impl Cfg<'_> {
    /// `layer_types` as one flag per layer, `sliding_attention` (true) or `full_attention`;
    /// `None` where the config names none (gpt-oss, Gemma-3).
    pub(super) fn sliding_layer_types(
        &self,
        layers: usize,
    ) -> Result<Option<Vec<bool>>, ModelError> {
        self.layer_types(layers, "sliding_attention / full_attention", |k| match k {
            "sliding_attention" => Some(true),
            "full_attention" => Some(false),
            _ => None,
        })
    }

    /// `layer_types` as one mixer per layer: `linear_attention` is the family's `recurrent`
    /// kind (Gated DeltaNet, Kimi Delta), `full_attention` is attention; `None` where the
    /// config names none (each family then has its own default pattern).
    pub(super) fn linear_layer_types(
        &self,
        layers: usize,
        recurrent: LayerKind,
    ) -> Result<Option<Vec<LayerKind>>, ModelError> {
        self.layer_types(layers, "linear_attention / full_attention", |k| match k {
            "linear_attention" => Some(recurrent),
            "full_attention" => Some(LayerKind::Attention),
            _ => None,
        })
    }

    /// Qwen4-Exp's `layer_types`: `linear_attention` (Gated DeltaNet) or attention, which its
    /// configs call `indexed_attention` (its releases `full_attention`): attention with the
    /// QSA indexer.
    pub(super) fn qwen4_layer_types(
        &self,
        layers: usize,
    ) -> Result<Option<Vec<LayerKind>>, ModelError> {
        let accepted = "linear_attention / indexed_attention / full_attention";
        self.layer_types(layers, accepted, |k| match k {
            "linear_attention" => Some(LayerKind::GatedDeltaNet),
            "indexed_attention" | "full_attention" => Some(LayerKind::Attention),
            _ => None,
        })
    }

    fn layer_types<T>(
        &self,
        layers: usize,
        accepted: &str,
        kind: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<Vec<T>>, ModelError> {
        self.per_layer_list(FIELD, layers, accepted, kind)
    }

    /// `field` as a list of exactly `layers` strings, each one `kind` knows (`None` where the
    /// config has no such field); the error names the field, the entry and the accepted
    /// values.
    pub(super) fn per_layer_list<T>(
        &self,
        field: &str,
        layers: usize,
        accepted: &str,
        kind: impl Fn(&str) -> Option<T>,
    ) -> Result<Option<Vec<T>>, ModelError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let entries = (v.as_array())
            .filter(|a| a.len() == layers)
            .ok_or_else(|| self.err(field, format!("expected a list of {layers} layer types")))?;
        let one = |k: &Value| {
            (k.as_str().and_then(&kind))
                .ok_or_else(|| self.err(field, format!("layer type {} ({accepted})", shown(k))))
        };
        entries.iter().map(one).collect::<Result<_, _>>().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::{Value, json};

    use super::*;

    fn parse(v: Value, layers: usize) -> Result<Option<Vec<LayerKind>>, String> {
        let cfg = Cfg::new(&v, Path::new("config.json")).unwrap();
        (cfg.linear_layer_types(layers, LayerKind::KimiDelta)).map_err(|e| e.to_string())
    }

    #[test]
    fn mixers_map_to_the_recurrent_kind_and_attention() {
        let kinds = parse(
            json!({"layer_types": ["linear_attention", "full_attention"]}),
            2,
        );
        let want = vec![LayerKind::KimiDelta, LayerKind::Attention];
        assert_eq!(kinds, Ok(Some(want)));
        assert_eq!(parse(json!({}), 2), Ok(None));
    }

    /// A wrong length, an unknown kind and a non-string are refused, naming the field and
    /// the entry.
    #[test]
    fn bad_lists_are_refused_by_name() {
        let lin = "linear_attention";
        for (v, says) in [
            (json!([lin]), "list of 2"),
            (json!("linear_attention"), "list of 2"),
            (json!([lin, "mamba"]), "\"mamba\""),
            (json!([lin, 3]), "layer type 3"),
            (
                json!([lin, "sliding_attention"]),
                "linear_attention / full_attention",
            ),
        ] {
            let e = parse(json!({ "layer_types": v }), 2).unwrap_err();
            assert!(e.contains("layer_types") && e.contains(says), "{e}");
        }
    }
}
