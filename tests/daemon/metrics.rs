//! `/metrics` over HTTP: Prometheus text, counters moving by the right amounts. One test in
//! this binary, because the metrics recorder is process-wide.

use crate::daemon_support;

use std::collections::HashMap;

use daemon_support::{TestDaemon, daemon_config};
use serde_json::json;

/// `name{labels}` -> value, checking that every line is valid Prometheus text.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let words: Vec<&str> = rest.split_whitespace().collect();
            assert!(
                matches!(words.first(), Some(&"HELP") | Some(&"TYPE")),
                "bad comment {line:?}"
            );
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            name.starts_with("hsx_") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name in {line:?}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "{line:?}");
        }
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        out.insert(series.to_owned(), v);
    }
    out
}

fn get(m: &HashMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_by_the_right_amounts() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&daemon_config(dir.path())).await;
    let (status, before) = d.get("/metrics").await;
    assert_eq!(status, 200);
    let before = parse(&before);

    let mut bytes = 0;
    for len in [5usize, 9, 13] {
        let prompt: Vec<u32> = (1..=len as u32).collect();
        let (status, resp) = d
            .post(
                "/v1/completions",
                &json!({"prompt": prompt, "max_tokens": 1}),
            )
            .await;
        assert_eq!(status, 200, "{resp}");
        let path = resp["kv_transfer_params"]["hidden_states_path"]
            .as_str()
            .unwrap();
        bytes += std::fs::metadata(path).unwrap().len();
    }
    let (status, _) = d.post("/v1/completions", &json!({"prompt": [9999]})).await;
    assert_eq!(status, 400);

    let (_, after) = d.get("/metrics").await;
    let after = parse(&after);
    let delta = |s: &str| get(&after, s) - get(&before, s);
    assert_eq!(delta("hsx_requests_total{state=\"accepted\"}"), 3.0);
    assert_eq!(delta("hsx_requests_total{state=\"completed\"}"), 3.0);
    assert_eq!(delta("hsx_requests_total{state=\"rejected\"}"), 1.0);
    assert_eq!(
        delta("hsx_requests_rejected_total{reason=\"token_out_of_range\"}"),
        1.0
    );
    assert_eq!(delta("hsx_files_saved_total"), 3.0);
    assert_eq!(delta("hsx_hidden_state_bytes_written_total"), bytes as f64);
    assert_eq!(delta("hsx_prompt_tokens_total"), 27.0);
    assert_eq!(delta("hsx_tokens_computed_total"), 27.0);
    assert_eq!(delta("hsx_tokens_written_total"), 27.0);
    assert_eq!(delta("hsx_save_duration_seconds_count"), 3.0);
    assert!(delta("hsx_steps_total") >= 1.0);
    assert!(delta("hsx_step_duration_seconds_count") >= 1.0);
    assert_eq!(delta("hsx_step_tokens_sum"), 27.0);
    // The runner's time per step: forward, its own work after it, the wait for a plan.
    for h in ["forward", "host", "wait"] {
        let count = format!("hsx_runner_{h}_seconds_count");
        assert_eq!(delta(&count), delta("hsx_steps_total"), "{count}");
    }
    for gauge in [
        "hsx_queue_waiting_requests",
        "hsx_running_requests",
        "hsx_connector_pending_bytes",
        "hsx_pending_hidden_bytes",
        "hsx_kv_blocks_used",
        "hsx_kv_blocks_total",
        "hsx_runner_spare_chunk_bytes",
    ] {
        assert!(after.contains_key(gauge), "{gauge} missing");
    }
    assert_eq!(get(&after, "hsx_kv_blocks_total"), 512.0);
    assert!(after.contains_key("hsx_step_duration_seconds_bucket{le=\"+Inf\"}"));
    d.stop().await;
}
