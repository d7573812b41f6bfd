use std::path::PathBuf;
use std::sync::Arc;

use super::*;

pub(super) fn limits(budget: usize, seqs: usize) -> SchedulerLimits {
    SchedulerLimits {
        max_num_batched_tokens: budget,
        max_num_seqs: seqs,
        max_waiting: 4,
        max_model_len: 100,
        vocab_size: 50,
        kv_capacity_tokens: 1000,
        row_bytes: 0,
        max_pending_bytes: usize::MAX,
    }
}

pub(super) fn req(id: &str, len: usize, max_tokens: u32) -> Request {
    Request {
        id: RequestId::new(id).unwrap(),
        prompt: (0..len as u32).map(|t| t % 50).collect::<Vec<_>>().into(),
        max_tokens,
        include_output_tokens: false,
        path: PathBuf::from(format!("/tmp/{id}.safetensors")),
        prefixes: Vec::new(),
    }
}

fn grant(block: u32) -> Grant {
    Grant {
        blocks: vec![block],
        ..Grant::default()
    }
}

pub(super) fn id(s: &str) -> RequestId {
    RequestId::new(s).unwrap()
}

/// Grants every candidate a dummy block list, plans, and returns the plan.
pub(super) fn step(s: &mut SchedulerState) -> Option<StepPlan> {
    let granted = s
        .admission_candidates()
        .into_iter()
        .map(|c| (c.id, grant(0)))
        .collect();
    s.plan_step(granted)
}

/// Output that samples token 7 for every sampling chunk.
pub(super) fn output_for(plan: &StepPlan) -> StepOutput {
    StepOutput {
        step: plan.step,
        sampled: plan
            .chunks
            .iter()
            .filter(|c| c.sample)
            .map(|c| (c.id.clone(), 7))
            .collect(),
        failed: Vec::new(),
    }
}

pub(super) fn chunk_shape(plan: &StepPlan) -> Vec<(String, usize, usize, bool)> {
    plan.chunks
        .iter()
        .map(|c| (c.id.to_string(), c.start, c.len, c.sample))
        .collect()
}

#[test]
fn chunked_prefill_splits_under_the_budget() {
    let mut s = SchedulerState::new(limits(4, 8));
    s.submit(req("a", 10, 1)).unwrap();
    let mut shapes = Vec::new();
    let mut finished = Vec::new();
    while let Some(plan) = step(&mut s) {
        shapes.extend(chunk_shape(&plan));
        finished.extend(s.apply(&output_for(&plan)).finished);
    }
    assert_eq!(
        shapes,
        vec![
            ("a".into(), 0, 4, false),
            ("a".into(), 4, 4, false),
            ("a".into(), 8, 2, true)
        ]
    );
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].token_ids.len(), 10);
    assert_eq!(finished[0].output_token_ids, vec![7]);
    assert!(s.is_idle());
}

#[test]
fn budget_is_shared_and_new_requests_are_announced_once() {
    let mut s = SchedulerState::new(limits(6, 8));
    s.submit(req("a", 4, 0)).unwrap();
    s.submit(req("b", 5, 0)).unwrap();
    let p1 = step(&mut s).unwrap();
    assert_eq!(
        chunk_shape(&p1),
        vec![("a".into(), 0, 4, false), ("b".into(), 0, 2, false)]
    );
    assert_eq!(p1.new_requests.len(), 2);
    let fx = s.apply(&output_for(&p1));
    assert_eq!(fx.finished.len(), 1);
    assert_eq!(fx.release_blocks, vec![id("a")]);
    let p2 = step(&mut s).unwrap();
    assert_eq!(chunk_shape(&p2), vec![("b".into(), 2, 3, false)]);
    assert!(p2.new_requests.is_empty());
    assert_eq!(p2.released, vec![id("a")]);
}

#[test]
fn capture_len_and_positions_cover_every_row_once() {
    let mut s = SchedulerState::new(limits(7, 8));
    s.submit(req("a", 30, 0)).unwrap();
    let mut covered = Vec::new();
    while let Some(plan) = step(&mut s) {
        for c in &plan.chunks {
            assert_eq!(c.capture_len, c.len);
            covered.extend(c.start..c.start + c.len);
        }
        s.apply(&output_for(&plan));
    }
    assert_eq!(covered, (0..30).collect::<Vec<_>>());
}

#[test]
fn max_num_seqs_limits_admission() {
    let mut s = SchedulerState::new(limits(100, 2));
    for n in ["a", "b", "c"] {
        s.submit(req(n, 3, 0)).unwrap();
    }
    let p = step(&mut s).unwrap();
    assert_eq!(p.chunks.len(), 2);
    assert_eq!(s.stats().waiting, 1);
}

#[test]
fn no_second_plan_while_a_step_is_in_flight() {
    let mut s = SchedulerState::new(limits(2, 8));
    s.submit(req("a", 5, 0)).unwrap();
    let p = step(&mut s).unwrap();
    assert!(s.admission_candidates().is_empty());
    assert!(s.plan_step(vec![]).is_none());
    s.apply(&output_for(&p));
    assert_eq!(step(&mut s).unwrap().chunks[0].start, 2);
}

#[test]
fn stale_output_is_ignored() {
    let mut s = SchedulerState::new(limits(2, 8));
    s.submit(req("a", 5, 0)).unwrap();
    let p = step(&mut s).unwrap();
    let mut wrong = output_for(&p);
    wrong.step += 1;
    s.apply(&wrong);
    assert!(s.step_in_flight());
}

#[test]
fn decode_steps_and_include_output_tokens() {
    let mut s = SchedulerState::new(limits(16, 8));
    let mut r = req("a", 3, 3);
    r.include_output_tokens = true;
    s.submit(r).unwrap();
    let mut shapes = Vec::new();
    let mut captured = 0;
    let mut finished = Vec::new();
    while let Some(plan) = step(&mut s) {
        shapes.extend(chunk_shape(&plan));
        captured += plan.chunks.iter().map(|c| c.capture_len).sum::<usize>();
        finished.extend(s.apply(&output_for(&plan)).finished);
    }
    assert_eq!(
        shapes,
        vec![
            ("a".into(), 0, 3, true),
            ("a".into(), 3, 1, true),
            ("a".into(), 4, 1, true)
        ]
    );
    assert_eq!(captured, 5);
    assert_eq!(finished[0].token_ids, vec![0, 1, 2, 7, 7]);
    assert_eq!(finished[0].output_token_ids, vec![7, 7, 7]);
}

#[test]
fn generated_rows_not_captured_by_default() {
    let mut s = SchedulerState::new(limits(16, 8));
    s.submit(req("a", 3, 2)).unwrap();
    let p1 = step(&mut s).unwrap();
    s.apply(&output_for(&p1));
    let p2 = step(&mut s).unwrap();
    assert_eq!(p2.chunks[0].capture_len, 0);
    let fx = s.apply(&output_for(&p2));
    assert_eq!(fx.finished[0].token_ids, vec![0, 1, 2]);
}

#[test]
fn submit_validation() {
    let mut s = SchedulerState::new(limits(16, 8));
    assert_eq!(s.submit(req("e", 0, 0)), Err(SubmitError::EmptyPrompt));
    assert!(matches!(
        s.submit(req("l", 99, 2)),
        Err(SubmitError::TooLong { len: 101, .. })
    ));
    let mut bad = req("v", 3, 0);
    bad.prompt = Arc::from(vec![1, 50, 2]);
    assert!(matches!(
        s.submit(bad),
        Err(SubmitError::TokenOutOfRange {
            token: 50,
            position: 1,
            ..
        })
    ));
    s.submit(req("d", 3, 0)).unwrap();
    assert!(matches!(
        s.submit(req("d", 3, 0)),
        Err(SubmitError::DuplicateId(_))
    ));
}

#[test]
fn too_large_for_cache_rejected() {
    let mut l = limits(16, 8);
    l.kv_capacity_tokens = 8;
    let mut s = SchedulerState::new(l);
    assert!(matches!(
        s.submit(req("a", 9, 0)),
        Err(SubmitError::TooLargeForCache { .. })
    ));
}

#[test]
fn waiting_queue_is_bounded() {
    let mut s = SchedulerState::new(limits(16, 8));
    for i in 0..4 {
        s.submit(req(&format!("r{i}"), 2, 0)).unwrap();
    }
    assert_eq!(s.submit(req("x", 2, 0)), Err(SubmitError::Overloaded(4)));
}

#[test]
fn abort_waiting_request() {
    let mut s = SchedulerState::new(limits(16, 8));
    s.submit(req("a", 2, 0)).unwrap();
    let fx = s.abort(&id("a"));
    assert_eq!(fx.failed.len(), 1);
    assert!(fx.release_blocks.is_empty());
    assert!(s.is_idle());
}

#[test]
fn abort_in_flight_request_drops_it_when_the_step_returns() {
    let mut s = SchedulerState::new(limits(2, 8));
    s.submit(req("a", 5, 0)).unwrap();
    let p = step(&mut s).unwrap();
    let fx = s.abort(&id("a"));
    assert!(fx.failed.is_empty());
    let fx = s.apply(&output_for(&p));
    assert_eq!(fx.release_blocks, vec![id("a")]);
    assert_eq!(fx.discard, vec![id("a")]);
    assert_eq!(fx.failed[0].1, "aborted");
    assert!(fx.finished.is_empty());
    assert!(step(&mut s).is_none());
}

#[test]
fn abort_running_request_between_steps() {
    let mut s = SchedulerState::new(limits(2, 8));
    s.submit(req("a", 5, 0)).unwrap();
    let p = step(&mut s).unwrap();
    s.apply(&output_for(&p));
    let fx = s.abort(&id("a"));
    assert_eq!(fx.release_blocks, vec![id("a")]);
    assert!(s.is_idle());
}

#[test]
fn failed_step_fails_its_requests_and_frees_blocks() {
    let mut s = SchedulerState::new(limits(8, 8));
    s.submit(req("a", 3, 0)).unwrap();
    s.submit(req("b", 3, 0)).unwrap();
    let p = step(&mut s).unwrap();
    let fx = s.fail_step(p.step, "boom");
    assert_eq!(fx.release_blocks.len(), 2);
    assert_eq!(fx.discard.len(), 2);
    assert!(fx.failed.iter().all(|(_, e)| e.contains("boom")));
    assert!(s.is_idle());
    s.submit(req("c", 3, 0)).unwrap();
    let p = step(&mut s).unwrap();
    assert_eq!(p.released.len(), 2);
}

#[test]
fn lost_device_fails_everything_and_admits_nothing_more() {
    // Budget 4: "a" (3) and one token of "b" run, "c" waits.
    let mut s = SchedulerState::new(limits(4, 8));
    for r in [req("a", 3, 0), req("b", 3, 0), req("c", 3, 0)] {
        s.submit(r).unwrap();
    }
    let p = step(&mut s).unwrap();
    assert_eq!(p.chunks.len(), 2);
    let fx = s.device_lost(p.step, "illegal address");
    let mut failed: Vec<_> = fx.failed.iter().map(|(i, _)| i.to_string()).collect();
    failed.sort();
    assert_eq!(failed, ["a", "b", "c"]);
    assert!(
        fx.failed
            .iter()
            .all(|(_, e)| e.contains("device is lost: illegal address"))
    );
    assert_eq!(fx.release_blocks.len(), 2);
    assert_eq!(fx.discard.len(), 2);
    assert!(s.is_idle() && s.stats().device_lost);
    let e = s.submit(req("d", 3, 0)).unwrap_err();
    assert!(matches!(e, SubmitError::DeviceLost(ref m) if m.contains("illegal address")));
    assert!(s.admission_candidates().is_empty() && step(&mut s).is_none());
}

#[test]
fn missing_sampled_token_fails_the_request() {
    let mut s = SchedulerState::new(limits(8, 8));
    s.submit(req("a", 3, 1)).unwrap();
    let p = step(&mut s).unwrap();
    let fx = s.apply(&StepOutput {
        step: p.step,
        ..Default::default()
    });
    assert!(fx.finished.is_empty());
    assert!(fx.failed[0].1.contains("sampled no token"));
}

#[test]
fn refused_states_fail_the_request_and_discard_its_rows() {
    let mut s = SchedulerState::new(limits(8, 8));
    s.submit(req("a", 3, 0)).unwrap();
    s.submit(req("b", 2, 0)).unwrap();
    let p = step(&mut s).unwrap();
    let fx = s.apply(&StepOutput {
        failed: vec![(id("a"), "layer 2 is all zeros".into())],
        ..output_for(&p)
    });
    assert_eq!(fx.discard, vec![id("a")]);
    assert_eq!(
        fx.failed,
        vec![(id("a"), "layer 2 is all zeros".to_string())]
    );
    assert_eq!(fx.finished.len(), 1);
    assert!(fx.release_blocks.contains(&id("a")));
}

#[test]
fn denied_reservation_keeps_request_waiting() {
    let mut s = SchedulerState::new(limits(8, 8));
    s.submit(req("a", 3, 0)).unwrap();
    s.submit(req("b", 3, 0)).unwrap();
    let cands = s.admission_candidates();
    assert_eq!(cands.len(), 2);
    // Only "b" granted ("a" waits for blocks in flight): b runs, a keeps its place.
    let p = s.plan_step(vec![(id("b"), grant(1))]).unwrap();
    assert_eq!(chunk_shape(&p), vec![("b".into(), 0, 3, false)]);
    assert_eq!(s.stats().waiting, 1);
    assert!(s.take_unused_grants().is_empty());
    s.apply(&output_for(&p));
    let p = s.plan_step(vec![(id("a"), grant(0))]).unwrap();
    assert_eq!(p.chunks.len(), 1);
    // A grant for a request no longer queued is handed back.
    s.apply(&output_for(&p));
    assert!(s.plan_step(vec![(id("zz"), grant(2))]).is_none());
    assert_eq!(s.take_unused_grants(), vec![id("zz")]);
}

// ------------------------------------------------------- engine.max_pending_bytes accounting

/// 10 bytes per row, at most `max` bytes held for admitted requests.
fn bounded(max: usize) -> SchedulerState {
    SchedulerState::new(SchedulerLimits {
        row_bytes: 10,
        max_pending_bytes: max,
        ..limits(8, 8)
    })
}

/// Runs steps until nothing can be planned; returns the requests finished or discarded (the
/// ones the connector will report released).
fn run_out(s: &mut SchedulerState) -> Vec<RequestId> {
    let mut ended = Vec::new();
    while let Some(p) = step(s) {
        let fx = s.apply(&output_for(&p));
        ended.extend(fx.finished.into_iter().map(|f| f.id));
        ended.extend(fx.discard);
    }
    ended
}

fn running_ids(p: &StepPlan) -> Vec<String> {
    p.new_requests.iter().map(|n| n.id.to_string()).collect()
}

#[test]
fn admission_stops_at_the_bytes_bound_and_resumes_on_release() {
    let mut s = bounded(100);
    s.submit(req("a", 6, 0)).unwrap(); // 60 bytes
    s.submit(req("b", 5, 0)).unwrap(); // 50: 110 > 100, waits
    s.submit(req("c", 3, 0)).unwrap(); // 30: would fit, but admission is FIFO
    let p = step(&mut s).unwrap();
    assert_eq!(running_ids(&p), vec!["a"]);
    assert_eq!(s.stats().pending_hidden_bytes, 60);
    assert_eq!(s.stats().memory_waits, 1);
    s.apply(&output_for(&p));
    // "a" is finished but its file is not written yet: its bytes still count.
    assert!(step(&mut s).is_none());
    assert_eq!((s.stats().waiting, s.stats().pending_hidden_bytes), (2, 60));
    assert_eq!(
        s.stats().memory_waits,
        1,
        "a waiting request is counted once"
    );
    assert_eq!(s.release_hidden(&id("a")), 60);
    let p = step(&mut s).unwrap();
    assert_eq!(running_ids(&p), vec!["b", "c"]);
    assert_eq!(s.stats().pending_hidden_bytes, 80);
    s.apply(&output_for(&p));
    s.release_hidden(&id("b"));
    s.release_hidden(&id("c"));
    let st = s.stats();
    assert_eq!(
        (st.pending_hidden_bytes, st.peak_pending_hidden_bytes),
        (0, 80)
    );
    assert!(s.is_idle());
}

#[test]
fn bound_counts_captured_rows_not_forward_tokens() {
    let mut s = bounded(100);
    // 4 prompt rows + 5 generated tokens, of which 4 are captured: 80 bytes.
    let mut a = req("a", 4, 5);
    a.include_output_tokens = true;
    s.submit(a).unwrap();
    // 4 prompt rows only (generated rows not captured): 40 bytes, 120 in all: waits.
    s.submit(req("b", 4, 5)).unwrap();
    let p = step(&mut s).unwrap();
    assert_eq!(running_ids(&p), vec!["a"]);
    assert_eq!(s.stats().pending_hidden_bytes, 80);
    s.apply(&output_for(&p));
    assert_eq!(run_out(&mut s), vec![id("a")]);
    assert_eq!(s.release_hidden(&id("a")), 80);
    assert_eq!(running_ids(&step(&mut s).unwrap()), vec!["b"]);
    assert_eq!(s.stats().pending_hidden_bytes, 40);
}

#[test]
fn request_larger_than_the_bound_is_rejected_at_submit() {
    let mut s = bounded(100);
    let e = s.submit(req("big", 11, 0)).unwrap_err();
    assert_eq!(
        e,
        SubmitError::TooLargeForHostMemory {
            rows: 11,
            bytes: 110,
            max: 100
        }
    );
    assert!(e.to_string().contains("engine.max_pending_bytes"), "{e}");
    // Exactly the bound fits, alone.
    s.submit(req("full", 10, 0)).unwrap();
    s.submit(req("next", 1, 0)).unwrap();
    assert_eq!(running_ids(&step(&mut s).unwrap()), vec!["full"]);
    assert_eq!(s.stats().pending_hidden_bytes, 100);
}

#[test]
fn bytes_are_released_on_every_path() {
    // Each admitted request ends in a finish or a discard for the connector, which reports the
    // release; after it no bytes are left, whichever way the request ended.
    let mut s = bounded(1000);
    // Finished.
    s.submit(req("done", 3, 0)).unwrap();
    assert_eq!(run_out(&mut s), vec![id("done")]);
    // Aborted while waiting: never admitted, nothing held.
    s.submit(req("w", 3, 0)).unwrap();
    s.abort(&id("w"));
    // Aborted between steps (running, not in flight).
    let mut long = req("between", 30, 0);
    s.submit(long.clone()).unwrap();
    let p = step(&mut s).unwrap();
    s.apply(&output_for(&p));
    let fx = s.abort(&id("between"));
    assert_eq!(fx.discard, vec![id("between")]);
    // Aborted while its step is in flight.
    long.id = id("inflight");
    s.submit(long.clone()).unwrap();
    let p = step(&mut s).unwrap();
    assert!(s.abort(&id("inflight")).discard.is_empty());
    assert_eq!(s.apply(&output_for(&p)).discard, vec![id("inflight")]);
    // Its step failed.
    long.id = id("failed");
    s.submit(long.clone()).unwrap();
    let p = step(&mut s).unwrap();
    assert_eq!(s.fail_step(p.step, "boom").discard, vec![id("failed")]);
    // The runner sampled no token.
    s.submit(req("nosample", 3, 1)).unwrap();
    let p = step(&mut s).unwrap();
    let fx = s.apply(&StepOutput {
        step: p.step,
        ..Default::default()
    });
    assert_eq!(fx.discard, vec![id("nosample")]);
    assert!(s.is_idle());
    assert_eq!(s.stats().pending_hidden_bytes, 30 + 300 * 3 + 30);
    for r in ["done", "between", "inflight", "failed", "nosample"] {
        assert!(s.release_hidden(&id(r)) > 0, "{r}");
    }
    assert_eq!(s.release_hidden(&id("w")), 0, "never admitted");
    assert_eq!(s.release_hidden(&id("done")), 0, "released once");
    assert_eq!(s.stats().pending_hidden_bytes, 0);
}

#[test]
fn id_reused_before_its_release_is_counted_per_admission() {
    let mut s = bounded(100);
    s.submit(req("a", 3, 0)).unwrap();
    run_out(&mut s);
    // Its file is not written yet when the same id comes again.
    s.submit(req("a", 5, 0)).unwrap();
    run_out(&mut s);
    assert_eq!(s.stats().pending_hidden_bytes, 80);
    assert_eq!(s.release_hidden(&id("a")), 30);
    assert_eq!(s.release_hidden(&id("a")), 50);
    assert_eq!(s.stats().pending_hidden_bytes, 0);
}

#[test]
fn prefix_hit_starts_after_the_cached_tokens_and_hands_over_their_rows() {
    let mut s = SchedulerState::new(limits(100, 4));
    s.submit(req("a", 40, 1)).unwrap();
    assert_eq!(s.admission_candidates()[0].prompt.len(), 40);
    let rows: Vec<Arc<[u8]>> = vec![vec![1u8; 4].into(), vec![2u8; 4].into()];
    let hit = Grant {
        blocks: vec![5, 6, 7],
        cached_tokens: 32,
        prefix_rows: rows.clone(),
        ..Grant::default()
    };
    let plan = s.plan_step(vec![(id("a"), hit)]).unwrap();
    assert_eq!(plan.new_requests[0].cached_tokens, 32);
    assert_eq!(chunk_shape(&plan), vec![("a".into(), 32, 8, true)]);
    assert_eq!(plan.chunks[0].capture_len, 8);
    let handed = s.take_prefix_rows();
    assert_eq!((handed[0].id.clone(), handed[0].rows), (id("a"), 32));
    assert_eq!(handed[0].blocks, rows);
    assert!(s.take_prefix_rows().is_empty());
    let fx = s.apply(&output_for(&plan));
    assert_eq!(s.stats().tokens_computed, 8);
    assert_eq!(fx.finished[0].token_ids.len(), 40);
}
