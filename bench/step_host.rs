//! The runner's host work between two forwards, on a GPU-sized step, without a GPU: the
//! captured bytes copied out of the (pinned) download buffer, then cut into one chunk per
//! request (`RunnerState::commit`), the chunks dropped on another thread as the connector's
//! writers do. A GPU waits for this every step.
//!
//! `cargo run --release --example step_host -- [--tokens 8192] [--layers 4] [--hidden 4096]
//! [--requests 2] [--steps 8]` (bf16 rows). Two ways, alternating step by step:
//! - `fresh`: how hsx did it until session 21 on CUDA: a new buffer for the copy and one per
//!   chunk, every step;
//! - `reused`: the step's buffer handed back to the capture (`recycle_captured`) and the
//!   chunks cut into allocations of earlier chunks (`ChunkPool`).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use hsx::actors::chunk_bytes::{ChunkPool, MIN_POOLED_BYTES};
use hsx::actors::messages::{NewRequestData, OutputDtype, PlannedChunk, RequestId, StepPlan};
use hsx::actors::model_runner::{RowShape, RunnerState};
use hsx::kernels::BatchOutput;

struct Args {
    tokens: usize,
    layers: usize,
    hidden: usize,
    requests: usize,
    steps: usize,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        tokens: 8192,
        layers: 4,
        hidden: 4096,
        requests: 2,
        steps: 8,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v: usize = it.next().context("missing value")?.parse()?;
        match flag.as_str() {
            "--tokens" => a.tokens = v,
            "--layers" => a.layers = v,
            "--hidden" => a.hidden = v,
            "--requests" => a.requests = v,
            "--steps" => a.steps = v,
            _ => anyhow::bail!("unknown flag {flag}"),
        }
    }
    anyhow::ensure!(a.requests >= 1 && a.tokens >= a.requests, "bad sizes");
    Ok(a)
}

/// Lengths of `requests` chunks summing to `tokens`, varying with the step (as a budget cuts
/// prompts of mixed lengths): cut points from a fixed pseudo-random sequence.
fn lengths(step: u64, tokens: usize, requests: usize) -> Vec<usize> {
    let mut x = step.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut cuts: Vec<usize> = (1..requests)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % (tokens as u64 - 1)) as usize
        })
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut edges = vec![0];
    edges.extend(cuts);
    edges.push(tokens);
    edges.windows(2).map(|w| w[1] - w[0]).collect()
}

/// One step's plan: new requests, one chunk each (`lens`), the previous step's released.
fn plan(step: u64, lens: &[usize], released: Vec<RequestId>) -> StepPlan {
    let ids: Vec<RequestId> = (0..lens.len())
        .map(|r| RequestId::new(&format!("s{step}-r{r}")).unwrap())
        .collect();
    let chunk = |(id, &len): (&RequestId, &usize)| PlannedChunk {
        id: id.clone(),
        start: 0,
        len,
        sample: false,
        capture_len: len,
    };
    StepPlan {
        step,
        new_requests: (ids.iter().zip(lens))
            .map(|(id, &len)| NewRequestData {
                id: id.clone(),
                prompt: Arc::from(vec![1u32; len]),
                block_ids: Vec::new(),
                state_slot: None,
                cached_tokens: 0,
            })
            .collect(),
        chunks: ids.iter().zip(lens).map(chunk).collect(),
        released,
        ..Default::default()
    }
}

fn main() -> Result<()> {
    let a = parse()?;
    let shape = RowShape {
        layers: a.layers,
        hidden: a.hidden,
        dtype: OutputDtype::Bf16,
    };
    let step_bytes = a.tokens * shape.bytes();
    let pinned: Vec<u8> = (0..step_bytes).map(|i| (i % 251) as u8).collect();
    // The writers: chunks are dropped there (a pooled one's allocation goes back from there).
    let (to_writer, writer) = flume::bounded::<Vec<hsx::actors::messages::CapturedChunk>>(4);
    let dropper = std::thread::spawn(move || {
        for chunks in writer.iter() {
            drop(chunks)
        }
    });
    let mut fresh = RunnerState::default();
    let pool = ChunkPool::new(2 * a.tokens * shape.bytes(), MIN_POOLED_BYTES);
    let mut reused = RunnerState::default().with_chunk_pool(pool);
    let mut spare: Vec<u8> = Vec::new();
    let (mut t_fresh, mut t_reused) = (Vec::new(), Vec::new());
    let mut released = (Vec::new(), Vec::new());
    for step in 0..a.steps as u64 {
        for pooled in [false, true] {
            let (state, rel) = match pooled {
                false => (&mut fresh, &mut released.0),
                true => (&mut reused, &mut released.1),
            };
            let p = plan(
                step,
                &lengths(step, a.tokens, a.requests),
                std::mem::take(rel),
            );
            state.prepare(&p)?;
            let t0 = Instant::now();
            let captured = if pooled {
                let mut b = std::mem::take(&mut spare);
                b.clear();
                b.extend_from_slice(&pinned);
                b
            } else {
                pinned.clone()
            };
            let out = BatchOutput {
                captured,
                dtype: OutputDtype::Bf16,
                sampled: vec![None; p.chunks.len()],
                bad_rows: Vec::new(),
            };
            let (_, chunks) = state.commit(&p, &out, shape)?;
            if pooled {
                spare = out.captured;
            } else {
                drop(out);
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            to_writer.send(chunks)?;
            *rel = p.chunks.iter().map(|c| c.id.clone()).collect();
            if step > 0 {
                if pooled { &mut t_reused } else { &mut t_fresh }.push(ms);
            }
        }
        // As a writer would have finished by the next step.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(to_writer);
    dropper.join().expect("dropper");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "step of {} tokens x {} layers x {} (bf16, {:.0} MiB) in {} chunks of varying lengths, {} steps: \
         runner host time per step (median) fresh {:.1} ms, reused {:.1} ms",
        a.tokens,
        a.layers,
        a.hidden,
        step_bytes as f64 / (1 << 20) as f64,
        a.requests,
        a.steps - 1,
        median(&mut t_fresh),
        median(&mut t_reused)
    );
    Ok(())
}
