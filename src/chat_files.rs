//! Where a model directory keeps its chat templates, in transformers' order of precedence
//! (`PreTrainedTokenizerBase.from_pretrained`, `ProcessorMixin`):
//! 1. `chat_template.jinja` (the default template) and `chat_templates/*.jinja` (named ones):
//!    what `save_pretrained` writes since transformers 4.5x; they override the tokenizer config;
//! 2. `chat_template.json` (`{"chat_template": ...}`): the legacy processor file of multimodal
//!    checkpoints;
//! 3. `tokenizer_config.json`'s `chat_template`: a string, or a list of `{name, template}`.
//!
//! Which one a render uses follows `get_chat_template`: `tool_use` when tools are given and
//! the model has one, else `default`.

use std::path::Path;

use serde_json::Value as Json;

use crate::chat::ChatError;

/// Named template sources (`default` for a single template).
pub type Templates = Vec<(String, String)>;

/// The templates of `dir`, or `None` (a model without a chat template). `tokenizer_config`:
/// the parsed `tokenizer_config.json` when there is one.
pub fn find(dir: &Path, tokenizer_config: Option<&Json>) -> Result<Option<Templates>, ChatError> {
    let mut named = jinja_files(dir)?;
    if let Some(default) = read_optional(&dir.join("chat_template.jinja"))? {
        named.insert(0, ("default".into(), default));
    }
    if !named.is_empty() {
        return Ok(Some(named));
    }
    let legacy = dir.join("chat_template.json");
    if let Some(text) = read_optional(&legacy)? {
        let bad = |message: String| ChatError::Config {
            path: legacy.display().to_string(),
            message,
        };
        let v: Json = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        return from_config_value(v.get("chat_template"))
            .map(Some)
            .ok_or_else(|| bad("no `chat_template` string or list of {name, template}".into()));
    }
    Ok(tokenizer_config.and_then(|c| from_config_value(c.get("chat_template"))))
}

/// `chat_templates/*.jinja`, sorted by name.
fn jinja_files(dir: &Path) -> Result<Templates, ChatError> {
    let sub = dir.join("chat_templates");
    let Ok(entries) = std::fs::read_dir(&sub) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let Some(stem) = name.strip_suffix(".jinja")
            && let Some(text) = read_optional(&path)?
        {
            out.push((stem.to_string(), text));
        }
    }
    out.sort();
    Ok(out)
}

fn read_optional(path: &Path) -> Result<Option<String>, ChatError> {
    if !path.is_file() {
        return Ok(None);
    }
    std::fs::read_to_string(path)
        .map(Some)
        .map_err(|e| ChatError::Config {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// A `chat_template` value: a string (the default), or a list of `{name, template}`.
fn from_config_value(v: Option<&Json>) -> Option<Templates> {
    match v? {
        Json::String(s) => Some(vec![("default".into(), s.clone())]),
        Json::Array(list) => {
            let named: Templates = list
                .iter()
                .filter_map(|t| {
                    let name = t.get("name")?.as_str()?;
                    Some((name.to_string(), t.get("template")?.as_str()?.to_string()))
                })
                .collect();
            (!named.is_empty()).then_some(named)
        }
        _ => None,
    }
}

/// The template a render uses (`get_chat_template`): `tool_use` with tools when there is one,
/// else `default`, else the only one.
pub fn pick(names: &[String], with_tools: bool) -> Result<&str, ChatError> {
    let has = |n: &str| names.iter().any(|x| x == n);
    if with_tools && has("tool_use") {
        return Ok("tool_use");
    }
    if has("default") {
        return Ok("default");
    }
    match names {
        [only] => Ok(only),
        _ => Err(ChatError::Render(format!(
            "the model has several chat templates ({}) and none named `default`",
            names.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir.join(name).parent().unwrap()).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn precedence_is_transformers() {
        let d = tempfile::tempdir().unwrap();
        let cfg = json!({"chat_template": "from tokenizer_config"});
        let got = |c: Option<&Json>| find(d.path(), c).unwrap();
        assert_eq!(got(None), None);
        assert_eq!(got(Some(&cfg)).unwrap()[0].1, "from tokenizer_config");
        write(
            d.path(),
            "chat_template.json",
            r#"{"chat_template": "from json"}"#,
        );
        assert_eq!(got(Some(&cfg)).unwrap()[0].1, "from json");
        write(d.path(), "chat_templates/tool_use.jinja", "tools");
        assert_eq!(
            got(Some(&cfg)).unwrap(),
            vec![("tool_use".into(), "tools".into())]
        );
        write(d.path(), "chat_template.jinja", "from jinja");
        let t = got(Some(&cfg)).unwrap();
        assert_eq!(t[0], ("default".into(), "from jinja".into()));
        assert_eq!(t[1], ("tool_use".into(), "tools".into()));
    }

    #[test]
    fn named_lists_and_picking() {
        let list =
            json!([{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]);
        let t = from_config_value(Some(&list)).unwrap();
        let names: Vec<String> = t.iter().map(|x| x.0.clone()).collect();
        assert_eq!(pick(&names, false).unwrap(), "default");
        assert_eq!(pick(&names, true).unwrap(), "tool_use");
        let two = vec!["a".to_string(), "b".to_string()];
        assert!(
            pick(&two, false)
                .unwrap_err()
                .to_string()
                .contains("none named")
        );
        assert_eq!(pick(&two[..1], true).unwrap(), "a");
        assert_eq!(from_config_value(Some(&json!(3))), None);
    }
}
