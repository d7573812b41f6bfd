//! Bad data is never silent (issue 17): a NaN in one embedding row of the bundled Llama makes
//! `hsx extract` fail exactly the requests whose prompts hold that token, naming the layer id
//! and token position, with no file under a final name, and exit non-zero; the other requests
//! are written. `engine.reject_bad_states = false` writes the raw states instead.

use std::path::Path;
use std::process::Command;

use crate::common::{HsFile, bundled_prompts, poisoned_llama};

/// Token 445 is in some bundled prompts, not all.
const TOKEN: u32 = 445;

fn extract(model: &Path, out: &Path, reject: bool) -> (bool, String) {
    let cfg = out.join("hsx.toml");
    let text = format!(
        "[model]\npath = {model:?}\nthreads = 2\n[engine]\nlayer_ids = [0, 2, 4]\n\
         max_num_batched_tokens = 61\nreject_bad_states = {reject}\n[output]\ndir = {:?}\n",
        out.join("out")
    );
    std::fs::write(&cfg, text).unwrap();
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompts.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_hsx"))
        .args([
            "extract",
            "--config",
            cfg.to_str().unwrap(),
            "--quiet",
            "--input",
        ])
        .arg(&input)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.success(), text)
}

#[test]
fn a_nan_weight_fails_the_requests_it_reaches_and_writes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let model = poisoned_llama(dir.path(), TOKEN);
    let (ok, log) = extract(&model, dir.path(), true);
    assert!(!ok, "extract must exit non-zero:\n{log}");
    let prompts = bundled_prompts();
    let hit: Vec<_> = prompts.iter().filter(|(_, t)| t.contains(&TOKEN)).collect();
    assert!(!hit.is_empty() && hit.len() < prompts.len());
    assert!(log.contains(&format!("failed {}", hit.len())), "{log}");
    for (id, tokens) in &prompts {
        let file = dir.path().join("out").join(format!("{id}.safetensors"));
        match tokens.iter().position(|&t| t == TOKEN) {
            Some(pos) => {
                assert!(!file.exists(), "{id}: file written");
                let line = log.lines().find(|l| l.contains(id.as_str())).unwrap_or("");
                let want = format!("layer 0 of token position {pos} holds NaN");
                assert!(line.contains(&want), "{id}: {line:?} lacks {want:?}");
            }
            None => {
                let f = HsFile::read(&file);
                assert!(f.values().iter().all(|v| v.is_finite()), "{id}");
            }
        }
    }
    let leftovers = std::fs::read_dir(dir.path().join("out")).unwrap().flatten();
    assert!(
        leftovers
            .into_iter()
            .all(|e| !e.file_name().to_string_lossy().ends_with(".tmp"))
    );
}

#[test]
fn the_switch_off_writes_the_raw_states() {
    let dir = tempfile::tempdir().unwrap();
    let model = poisoned_llama(dir.path(), TOKEN);
    let (ok, log) = extract(&model, dir.path(), false);
    assert!(ok, "{log}");
    let (id, _) = bundled_prompts()
        .into_iter()
        .find(|(_, t)| t.contains(&TOKEN))
        .unwrap();
    let f = HsFile::read(&dir.path().join("out").join(format!("{id}.safetensors")));
    assert!(f.values().iter().any(|v| v.is_nan()));
}
