//! Prefix reuse across requests (`engine.prefix_cache_bytes`): a 5-turn conversation sent over
//! HTTP as 5 requests, each a prefix of the next, in growing and in shrinking order, computes
//! at most 1.25× its longest row, and every file equals a cold run of the same prompt (tensor
//! bytes; the header's metadata order is per process). Also the byte bound, hybrid models
//! (Gated DeltaNet, Mamba-2), whose recurrent state is restored from snapshots at block
//! boundaries, and requests running at the same time (the turns sent at once), which share
//! blocks as they are computed.

use crate::common;
use crate::daemon_support;

use std::collections::HashMap;
use std::path::PathBuf;

use common::HsFile;
use daemon_support::{TestDaemon, daemon_config};
use serde_json::{Value, json};

const TURNS: [usize; 5] = [60, 120, 180, 240, 301];

/// The conversation of the tests (seed 16); others for a second conversation.
const CONVERSATION: u64 = 16;

fn conversation() -> Vec<u32> {
    conversation_of(CONVERSATION)
}

fn conversation_of(seed: u64) -> Vec<u32> {
    common::random_prompt(seed, 301, 512)
}

/// Files of a cold run (prefix reuse off, fresh engine) of each turn's prompt, by length.
async fn cold_files(model: &str, layers: &[usize]) -> HashMap<usize, HsFile> {
    cold_files_of(model, layers, CONVERSATION).await
}

async fn cold_files_of(model: &str, layers: &[usize], seed: u64) -> HashMap<usize, HsFile> {
    let conv = conversation_of(seed);
    let reqs: Vec<_> = TURNS
        .iter()
        .map(|&n| common::spec(&format!("cold{n}"), &conv[..n]))
        .collect();
    let files = common::run_files(model, layers, 64, 1, &reqs).await;
    TURNS
        .iter()
        .map(|&n| (n, files[&format!("cold{n}")].clone()))
        .collect()
}

async fn status(d: &TestDaemon) -> Value {
    let mut conn = d.connect().await;
    conn.request(&json!({"op": "status"})).await.unwrap()
}

/// Sends the turns in `order` one after another (each after the previous response) and
/// returns the tokens computed and each turn's file.
async fn run_turns(d: &TestDaemon, order: &[usize]) -> (u64, HashMap<usize, HsFile>) {
    let conv = conversation();
    let before = status(d).await["tokens_computed"].as_u64().unwrap();
    let mut files = HashMap::new();
    for &n in order {
        let body = json!({"prompt": &conv[..n], "max_tokens": 1, "return_token_ids": true});
        let (code, resp) = d.post("/v1/completions", &body).await;
        assert_eq!(code, 200, "{resp}");
        let path = resp["kv_transfer_params"]["hidden_states_path"]
            .as_str()
            .unwrap();
        files.insert(n, HsFile::read(&PathBuf::from(path)));
    }
    let after = status(d).await["tokens_computed"].as_u64().unwrap();
    (after - before, files)
}

fn assert_same(got: &HashMap<usize, HsFile>, cold: &HashMap<usize, HsFile>, what: &str) {
    for n in TURNS {
        let (g, c) = (&got[&n], &cold[&n]);
        assert_eq!(g.shape, c.shape, "{what}: turn {n}");
        assert_eq!(g.token_ids, c.token_ids, "{what}: turn {n}");
        assert!(
            g.raw == c.raw,
            "{what}: turn {n}: hidden states differ from a cold run"
        );
    }
}

/// An attention-only model: the conversation in both orders computes at most 1.25× its longest
/// row, every file equal to a cold run, 18 blocks of rows cached.
async fn attention_conversation(model: &str) {
    let cold = cold_files(model, &[0, 2, 4]).await;
    let mut shrinking = TURNS;
    shrinking.reverse();
    for (what, order) in [("growing", TURNS), ("shrinking", shrinking)] {
        let dir = tempfile::tempdir().unwrap();
        let d = start_daemon(dir.path(), model, 4 << 20).await;
        let (computed, files) = run_turns(&d, &order).await;
        // Growing: 60 + 72 + 68 + 64 + 61; shrinking: 301 + 16 + 4 + 8 + 12 (full blocks of
        // 16 reused, the last token of a prompt always computed).
        assert!(
            computed * 4 <= 301 * 5,
            "{model} {what}: {computed} tokens computed"
        );
        assert_same(&files, &cold, &format!("{model} {what}"));
        let s = status(&d).await;
        assert!(s["prefix_cache_hit_tokens"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["prefix_cache_blocks"], 18, "{s}");
        assert_eq!(s["prefix_cache_bytes"], 18 * block_rows(model), "{s}");
        eprintln!("{model} {what}: {computed} tokens computed for 5 turns (longest 301)");
        d.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversation_turns_computed_once_in_either_order() {
    attention_conversation("llama").await;
}

/// Gemma 4 E2B's layout: its last 3 layers read the keys and values of earlier layers (KV
/// sharing), which prefix reuse restores only through those layers' cache; sliding windows of
/// 8 keys, shorter than a block; per-layer embeddings made per token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_sharing_model_reuses_prefixes_exactly() {
    attention_conversation("gemma4_e2b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_bytes_stay_under_the_bound_and_files_stay_exact() {
    let cold = cold_files("llama", &[0, 2, 4]).await;
    let dir = tempfile::tempdir().unwrap();
    // Rows of 5 blocks.
    let bound = 5 * block_rows("llama") as usize;
    let d = start_daemon(dir.path(), "llama", bound).await;
    let (computed, files) = run_turns(&d, &TURNS).await;
    assert_same(&files, &cold, "bounded");
    let s = status(&d).await;
    assert!(
        s["prefix_cache_bytes"].as_u64().unwrap() as usize <= bound,
        "{s}"
    );
    assert_eq!(s["prefix_cache_blocks"], 5, "{s}");
    // Some reuse (the first 5 blocks stay), less than unbounded.
    assert!(computed < 901 && computed > 325, "{computed}");
    eprintln!("bounded to 5 blocks: {computed} tokens computed for 5 turns");
    d.stop().await;
}

/// Bytes of one block's captured rows of `model` here (16 tokens × K 3 × its stream width —
/// the hidden size, times Qwen4-Exp's `hc_count` streams — × f32).
fn block_rows(model: &str) -> u64 {
    let path = common::model_dir(model).join("config.json");
    let cfg: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let text = cfg.get("text_config").unwrap_or(&cfg);
    let streams = text.get("hc_count").and_then(Value::as_u64).unwrap_or(1);
    16 * 3 * text["hidden_size"].as_u64().unwrap() * streams * 4
}

/// A hybrid model (recurrent state restored from snapshots at block boundaries): the
/// conversation in both orders computes at most 1.25× its longest row with files equal to cold
/// runs; then under a bound of 5 blocks' rows and 3 snapshots' bytes, the cache stays under
/// it, still reuses some blocks, and the files stay exact.
async fn hybrid_conversation(model: &str) {
    let cold = cold_files(model, &[0, 2, 4]).await;
    let mut shrinking = TURNS;
    shrinking.reverse();
    let mut snapshot_bytes = 0;
    for (what, order) in [("growing", TURNS), ("shrinking", shrinking)] {
        let dir = tempfile::tempdir().unwrap();
        let d = start_daemon(dir.path(), model, 4 << 20).await;
        let (computed, files) = run_turns(&d, &order).await;
        assert_same(&files, &cold, &format!("{model} {what}"));
        let s = status(&d).await;
        assert!(
            computed * 4 <= 301 * 5,
            "{model} {what}: {computed} tokens computed ({s})"
        );
        assert_eq!(s["prefix_cache_blocks"], 18, "{s}");
        let snapshots = s["prefix_cache_snapshots"].as_u64().unwrap();
        let bytes = s["prefix_cache_bytes"].as_u64().unwrap();
        assert!(snapshots >= 15, "{s}");
        snapshot_bytes = (bytes - 18 * block_rows(model)) / snapshots;
        assert_eq!(
            snapshot_bytes * snapshots + 18 * block_rows(model),
            bytes,
            "{s}"
        );
        eprintln!(
            "{model} {what}: {computed} tokens computed for 5 turns (longest 301), {snapshots} snapshots of {snapshot_bytes} bytes"
        );
        d.stop().await;
    }
    let bound = 5 * block_rows(model) + 3 * snapshot_bytes;
    let dir = tempfile::tempdir().unwrap();
    let d = start_daemon(dir.path(), model, bound as usize).await;
    let (computed, files) = run_turns(&d, &TURNS).await;
    assert_same(&files, &cold, &format!("{model} bounded"));
    let s = status(&d).await;
    assert!(s["prefix_cache_bytes"].as_u64().unwrap() <= bound, "{s}");
    assert!(computed < 901, "{model} bounded: {computed} ({s})");
    eprintln!("{model} bounded to {bound} bytes: {computed} tokens computed for 5 turns");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_deltanet_model_restores_state_snapshots_exactly() {
    hybrid_conversation("qwen3_5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mamba2_model_restores_state_snapshots_exactly() {
    hybrid_conversation("nemotron_h").await;
}

/// LFM2: the short convolutions' windows are the whole recurrent state (no recurrence state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_conv_model_restores_state_snapshots_exactly() {
    hybrid_conversation("lfm2").await;
}

/// Falcon-H1: every layer keeps its KV cache and its Mamba-2 state side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_hybrid_model_restores_state_snapshots_exactly() {
    hybrid_conversation("falcon_h1").await;
}

/// Kimi Linear: Kimi Delta Attention's state (a decay per key channel) beside latent attention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kimi_delta_model_restores_state_snapshots_exactly() {
    hybrid_conversation("kimi_linear").await;
}

/// Qwen4-Exp as released: rows of 4 streams, the n-gram embeddings' conv window restored with
/// the Gated DeltaNet states, and the n-grams of a chunk after a reused prefix reaching back
/// into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_connected_ngram_model_restores_state_snapshots_exactly() {
    hybrid_conversation("qwen4_exp_ple").await;
}

/// Qwen4-Exp with QSA past 19 keys: each later token selects over the reused blocks' raw
/// indexer keys (kept in their KV slots) as a cold run does, so the files are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qsa_model_selects_over_reused_prefixes_exactly() {
    hybrid_conversation("qwen4_exp_qsa").await;
}

/// Posts these prompts (turn lengths of the conversation of `seed`) all at once over HTTP and
/// returns the tokens computed and each one's file, by position in `turns`.
async fn send_at_once(d: &TestDaemon, seed: u64, turns: &[usize]) -> (u64, Vec<HsFile>) {
    let conv = conversation_of(seed);
    let before = status(d).await["tokens_computed"].as_u64().unwrap();
    let mut posts = tokio::task::JoinSet::new();
    for (i, &n) in turns.iter().enumerate() {
        let body = json!({"prompt": &conv[..n], "max_tokens": 1}).to_string();
        let addr = d.http;
        posts.spawn(async move {
            let (code, text) =
                daemon_support::http(addr, "POST", "/v1/completions", Some(&body)).await;
            assert_eq!(code, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            let path = v["kv_transfer_params"]["hidden_states_path"]
                .as_str()
                .unwrap();
            (i, HsFile::read(&PathBuf::from(path)))
        });
    }
    let mut files: Vec<(usize, HsFile)> = posts.join_all().await;
    files.sort_by_key(|f| f.0);
    let after = status(d).await["tokens_computed"].as_u64().unwrap();
    (after - before, files.into_iter().map(|f| f.1).collect())
}

async fn start_daemon(dir: &std::path::Path, model: &str, cache_bytes: usize) -> TestDaemon {
    let mut cfg = daemon_config(dir);
    cfg.model.path = common::model_dir(model);
    cfg.engine.prefix_cache_bytes = cache_bytes;
    TestDaemon::start(&cfg).await
}

/// The 5 turns sent at once: requests running at the same time share the blocks one of them
/// computes (the others wait for them), so the conversation costs at most 1.25× its longest
/// row, as one after the other; then again with every block cached; every file equals a cold
/// run. Then, under a bound of 5 blocks' rows (and, for hybrid models, 3 snapshots), blocks
/// are evicted while requests run and the files stay exact.
async fn concurrent_turns(model: &str) {
    let cold = cold_files(model, &[0, 2, 4]).await;
    let by_turn = |files: Vec<HsFile>| TURNS.iter().copied().zip(files).collect();
    let dir = tempfile::tempdir().unwrap();
    let d = start_daemon(dir.path(), model, 4 << 20).await;
    let mut snapshot_bytes = 0;
    for round in 0..2 {
        let (computed, files) = send_at_once(&d, CONVERSATION, &TURNS).await;
        assert_same(
            &by_turn(files),
            &cold,
            &format!("{model} at once, round {round}"),
        );
        let s = status(&d).await;
        assert!(
            computed * 4 <= 301 * 5,
            "{model} at once, round {round}: {computed} tokens computed ({s})"
        );
        assert_eq!(s["prefix_cache_blocks"], 18, "{s}");
        let snapshots = s["prefix_cache_snapshots"].as_u64().unwrap();
        let bytes = s["prefix_cache_bytes"].as_u64().unwrap();
        snapshot_bytes = (bytes - 18 * block_rows(model))
            .checked_div(snapshots)
            .unwrap_or(0);
        let waited = &s["prefix_cache_waited_tokens"];
        eprintln!(
            "{model} at once, round {round}: {computed} tokens computed (longest 301), {waited} reused after waiting"
        );
    }
    d.stop().await;
    let bound = (5 * block_rows(model) + 3 * snapshot_bytes) as usize;
    bounded_concurrent_turns(model, bound, &cold).await;
}

/// Under `bound`, the conversation at once, then a second conversation at once (whose blocks
/// evict the first's while its requests run), then the first's shortest turn alone: every
/// file equals a cold run, the cache stays under the bound, and the first conversation's
/// blocks were evicted.
async fn bounded_concurrent_turns(model: &str, bound: usize, cold: &HashMap<usize, HsFile>) {
    const OTHER: u64 = 17;
    let cold_other = cold_files_of(model, &[0, 2, 4], OTHER).await;
    let by_turn = |files: Vec<HsFile>| TURNS.iter().copied().zip(files).collect();
    let dir = tempfile::tempdir().unwrap();
    let d = start_daemon(dir.path(), model, bound).await;
    for (seed, cold) in [(CONVERSATION, cold), (OTHER, &cold_other)] {
        let (computed, files) = send_at_once(&d, seed, &TURNS).await;
        assert_same(
            &by_turn(files),
            cold,
            &format!("{model} at once, bounded, {seed}"),
        );
        let s = status(&d).await;
        assert!(
            s["prefix_cache_bytes"].as_u64().unwrap() as usize <= bound,
            "{s}"
        );
        eprintln!(
            "{model} at once, bounded, conversation {seed}: {computed} tokens computed ({s})"
        );
    }
    let (computed, files) = send_at_once(&d, CONVERSATION, &[60]).await;
    assert!(
        files[0].raw == cold[&60].raw,
        "{model}: turn 60 after evictions"
    );
    assert_eq!(
        computed, 60,
        "{model}: the first conversation's blocks were evicted"
    );
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_share_blocks_while_they_run_dense() {
    concurrent_turns("llama").await;
}

/// Gemma 4 E2B's KV sharing (as [`kv_sharing_model_reuses_prefixes_exactly`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_share_blocks_while_they_run_kv_sharing() {
    concurrent_turns("gemma4_e2b").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_share_blocks_while_they_run_gated_deltanet() {
    concurrent_turns("qwen3_5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_share_blocks_while_they_run_mamba2() {
    concurrent_turns("nemotron_h").await;
}

/// Two identical prompts at once: one computes, the other waits and reuses every full block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_prompts_at_once_are_computed_once() {
    let cold = cold_files("llama", &[0, 2, 4]).await;
    let dir = tempfile::tempdir().unwrap();
    let d = start_daemon(dir.path(), "llama", 4 << 20).await;
    let (computed, files) = send_at_once(&d, CONVERSATION, &[301, 301]).await;
    for f in &files {
        assert!(f.raw == cold[&301].raw, "differs from a cold run");
        assert_eq!(f.token_ids, cold[&301].token_ids);
    }
    // 301 once, plus the second's tokens past its 18 reused blocks (288 tokens), for which
    // it waited: the first was computing them when the second could start.
    let s = status(&d).await;
    assert_eq!(computed, 301 + 13, "{s}");
    assert_eq!(s["prefix_cache_waited_tokens"], 288, "{s}");
    d.stop().await;
}
