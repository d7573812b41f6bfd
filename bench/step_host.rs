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
use hsx::actors::messages::{
    CapturedChunk, NewRequestData, OutputDtype, PlannedChunk, RequestId, StepPlan,
};
use hsx::actors::model_runner::{RowShape, RunnerState};
use hsx::kernels::BatchOutput;
use hsx::kernels::host_copy::copy_into;

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

/// One way of doing the runner's host work, and its timings.
struct Way {
    name: &'static str,
    state: RunnerState,
    /// Reuse the step's buffer (else a new one per step, dropped after the cut).
    recycle: bool,
    /// Copies on this pool (1 thread), else on rayon's global pool.
    threads: Option<rayon::ThreadPool>,
    spare: Vec<u8>,
    released: Vec<RequestId>,
    ms: Vec<f64>,
}

impl Way {
    fn new(name: &'static str, pool: Option<ChunkPool>, one_thread: bool) -> Result<Self> {
        let threads = match one_thread {
            true => Some(rayon::ThreadPoolBuilder::new().num_threads(1).build()?),
            false => None,
        };
        Ok(Self {
            name,
            recycle: pool.is_some(),
            state: pool.map_or_else(RunnerState::default, |p| {
                RunnerState::default().with_chunk_pool(p)
            }),
            threads,
            spare: Vec::new(),
            released: Vec::new(),
            ms: Vec::new(),
        })
    }

    /// One step: the copy out of `pinned`, the cut; returns the chunks (timed up to here).
    fn step(
        &mut self,
        step: u64,
        lens: &[usize],
        pinned: &[u8],
        shape: RowShape,
    ) -> Result<Vec<CapturedChunk>> {
        let p = plan(step, lens, std::mem::take(&mut self.released));
        self.state.prepare(&p)?;
        let t0 = Instant::now();
        let mut work = || -> Result<Vec<CapturedChunk>> {
            let captured = match self.recycle {
                true => {
                    let mut b = std::mem::take(&mut self.spare);
                    copy_into(&mut b, pinned);
                    b
                }
                false => pinned.to_vec(),
            };
            let out = BatchOutput {
                captured,
                dtype: OutputDtype::Bf16,
                sampled: vec![None; p.chunks.len()],
                bad_rows: Vec::new(),
            };
            let (_, chunks) = self.state.commit(&p, &out, shape)?;
            if self.recycle {
                self.spare = out.captured;
            }
            Ok(chunks)
        };
        let chunks = match self.threads.take() {
            Some(pool) => {
                let c = pool.install(&mut work);
                self.threads = Some(pool);
                c?
            }
            None => work()?,
        };
        if step > 0 {
            self.ms.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        self.released = p.chunks.iter().map(|c| c.id.clone()).collect();
        Ok(chunks)
    }

    fn median(&mut self) -> f64 {
        self.ms.sort_by(f64::total_cmp);
        self.ms[self.ms.len() / 2]
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
    let (to_writer, writer) = flume::bounded::<Vec<CapturedChunk>>(4);
    let dropper = std::thread::spawn(move || {
        for chunks in writer.iter() {
            drop(chunks)
        }
    });
    let pool = || Some(ChunkPool::new(2 * step_bytes, MIN_POOLED_BYTES));
    let mut ways = [
        Way::new("new buffers", None, true)?,
        Way::new("reused, 1 thread", pool(), true)?,
        Way::new("reused, all threads", pool(), false)?,
    ];
    for step in 0..a.steps as u64 {
        let lens = lengths(step, a.tokens, a.requests);
        for way in &mut ways {
            to_writer.send(way.step(step, &lens, &pinned, shape)?)?;
        }
        // As a writer would have finished by the next step.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(to_writer);
    dropper.join().expect("dropper");
    let cpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let times: Vec<String> = (ways.iter_mut())
        .map(|w| {
            let ms = w.median();
            format!("{} {ms:.1} ms", w.name)
        })
        .collect();
    println!(
        "step of {} tokens x {} layers x {} (bf16, {:.0} MiB) in {} chunks of varying lengths, \
         {} steps, {cpu} threads: runner host time per step (median): {}",
        a.tokens,
        a.layers,
        a.hidden,
        step_bytes as f64 / (1 << 20) as f64,
        a.requests,
        a.steps - 1,
        times.join(", ")
    );
    Ok(())
}
