//! Prometheus metrics: the process-wide recorder (installed once), gauges refreshed at each
//! scrape, and the text rendering served at `/metrics`.
//!
//! Series (all prefixed `hsx_`): `requests_total{state}` (accepted, rejected, completed,
//! failed), `requests_rejected_total{reason}`, `queue_waiting_requests`, `running_requests`,
//! `tokens_computed_total`, `prompt_tokens_total`, `steps_total`, `step_duration_seconds`,
//! `step_tokens`, `hidden_state_bytes_written_total`, `save_duration_seconds`,
//! `files_saved_total`, `files_failed_total{kind}`, `connector_pending_bytes`,
//! `pending_hidden_bytes`, `admission_memory_waits_total`,
//! `kv_blocks_used`, `kv_blocks_total`, `events_published_total`, `subscribers_dropped_total`,
//! `socket_connections`, `prefix_cache_hit_tokens_total`, `prefix_cache_waited_tokens_total`,
//! `prefix_cache_blocks`, `prefix_cache_bytes`, `prefix_cache_snapshots`,
//! `runner_forward_seconds`, `runner_host_seconds`, `runner_wait_seconds`,
//! `runner_spare_chunk_bytes`.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::Shared;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

const SECONDS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const TOKENS: &[f64] = &[
    1.0, 8.0, 32.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// The handle of the process-wide recorder, installing it on first use. A process runs one
/// daemon; tests that start several in one process share the recorder (counters accumulate).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full("hsx_step_tokens".into()), TOKENS)
                });
            let recorder = match builder {
                Ok(b) => b.build_recorder(),
                Err(e) => {
                    tracing::warn!("metrics buckets: {e}");
                    PrometheusBuilder::new().build_recorder()
                }
            };
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "hsx_requests_total",
        "Requests by state: accepted, rejected, completed, failed"
    );
    describe_counter!("hsx_requests_rejected_total", "Rejected requests by reason");
    describe_gauge!(
        "hsx_queue_waiting_requests",
        "Requests waiting for admission"
    );
    describe_gauge!("hsx_running_requests", "Requests running");
    describe_counter!("hsx_tokens_computed_total", "Tokens through the model");
    describe_counter!(
        "hsx_tokens_written_total",
        "Rows written to files (prefix fan-out writes rows it did not compute)"
    );
    describe_counter!("hsx_prompt_tokens_total", "Prompt tokens through the model");
    describe_counter!(
        "hsx_prefix_cache_hit_tokens_total",
        "Prompt tokens reused from the prefix cache (KV and captured rows), not computed"
    );
    describe_counter!(
        "hsx_prefix_cache_waited_tokens_total",
        "Of the prefix-cache hit tokens, those served to requests that waited for a running \
         request to compute them"
    );
    describe_gauge!(
        "hsx_prefix_cache_blocks",
        "Reusable blocks in the prefix cache (KV block and rows)"
    );
    describe_gauge!(
        "hsx_prefix_cache_bytes",
        Unit::Bytes,
        "Captured rows and recurrent-state snapshots held by the prefix cache (bound: \
         engine.prefix_cache_bytes)"
    );
    describe_gauge!(
        "hsx_prefix_cache_snapshots",
        "Recurrent-state snapshots at block boundaries in the prefix cache (hybrid models)"
    );
    describe_counter!("hsx_steps_total", "Engine steps");
    describe_histogram!("hsx_step_duration_seconds", Unit::Seconds, "Step duration");
    describe_histogram!("hsx_step_tokens", "Tokens per step");
    describe_counter!(
        "hsx_hidden_state_bytes_written_total",
        Unit::Bytes,
        "Bytes of files written"
    );
    describe_histogram!(
        "hsx_save_duration_seconds",
        Unit::Seconds,
        "Request finished to file renamed"
    );
    describe_counter!(
        "hsx_files_saved_total",
        "Files written and renamed into place"
    );
    describe_counter!("hsx_files_failed_total", "Files not written, by kind");
    describe_gauge!(
        "hsx_connector_pending_bytes",
        Unit::Bytes,
        "Hidden states held in host memory"
    );
    describe_gauge!(
        "hsx_pending_hidden_bytes",
        Unit::Bytes,
        "Hidden-state bytes counted for admitted requests against engine.max_pending_bytes"
    );
    describe_counter!(
        "hsx_admission_memory_waits_total",
        "Requests that waited for admission until hidden-state bytes were released"
    );
    describe_gauge!("hsx_kv_blocks_used", "KV cache blocks in use");
    describe_gauge!("hsx_kv_blocks_total", "KV cache blocks");
    describe_counter!("hsx_events_published_total", "Completion events published");
    describe_counter!(
        "hsx_subscribers_dropped_total",
        "Subscribers disconnected for lagging"
    );
    describe_gauge!("hsx_socket_connections", "Open Unix socket connections");
    describe_histogram!(
        "hsx_runner_forward_seconds",
        Unit::Seconds,
        "Per step, the backend's forward (on a GPU: launches, the wait for the device, the rows \
         copied out)"
    );
    describe_histogram!(
        "hsx_runner_host_seconds",
        Unit::Seconds,
        "Per step, the model runner's work after the forward (rows cut per request, handed on)"
    );
    describe_histogram!(
        "hsx_runner_wait_seconds",
        Unit::Seconds,
        "Per step, the model runner's wait for the scheduler's plan"
    );
    describe_gauge!(
        "hsx_runner_spare_chunk_bytes",
        Unit::Bytes,
        "Allocations of written chunks kept to cut later steps' rows into (at most two steps')"
    );
}

/// Refreshes the gauges from the actors, then renders every series.
pub async fn render(shared: &Shared, handle: &PrometheusHandle) -> String {
    let e = shared.engine();
    let (sched, conn, blocks) = tokio::join!(e.status(), e.connector_stats(), e.block_stats());
    if let Some(s) = sched {
        metrics::gauge!("hsx_queue_waiting_requests").set(s.waiting as f64);
        metrics::gauge!("hsx_running_requests").set(s.running as f64);
        metrics::gauge!("hsx_pending_hidden_bytes").set(s.pending_hidden_bytes as f64);
    }
    if let Some(c) = conn {
        metrics::gauge!("hsx_connector_pending_bytes")
            .set((c.pending_bytes + c.writing_bytes) as f64);
    }
    if let Some(b) = blocks {
        metrics::gauge!("hsx_kv_blocks_used").set((b.total - b.free) as f64);
        metrics::gauge!("hsx_kv_blocks_total").set(b.total as f64);
    }
    handle.render()
}
