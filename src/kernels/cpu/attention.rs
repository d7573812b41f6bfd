//! Causal GQA attention over the paged KV cache, reading keys and values in place.
//!
//! # Work split
//! The batch's tokens are cut into runs (consecutive tokens of one sequence chunk), each run
//! into tiles of up to [`TILE_ROWS`] query rows (a row is one token × one query head of a kv
//! head), and every (tile, kv head) is one rayon task. A task reads keys and values of positions
//! `0..len` of its sequence **from the cache only** (the caller writes the batch's K/V first),
//! straight from their slots: no gather, no copy, only the tile's queries are transposed.
//!
//! # Fixed arithmetic per token (bit-identical whatever the batch, chunking or threads)
//! For query row r (length `len_r = position + 1`) and key j < len_r:
//! - score `s_rj = (fma-chain over d = 0..hd of q_r[d]·k_j[d], from 0) · scale`, one lane per
//!   row (the SIMD vector runs over the rows of the tile, never over d);
//! - `m_r = max_j s_rj`, `e_rj = exp(s_rj - m_r)` with [`exp_neg`] (a fixed polynomial),
//!   `sum_r = ((e_r0 + e_r1) + e_r2) + …` in key order;
//! - `o_r[d] = (fma-chain over j = 0..len of e_rj·v_j[d], from 0) · (1 / sum_r)`.
//!
//! With a sliding window of `w` (gpt-oss), row r sees keys `lo_r = max(0, len_r - w) .. len_r`
//! only, with Llama-4's chunks of `c` keys `lo_r = p - p % c ..= p`: the max, the sum and the
//! weighted values run over those, in key order from `lo_r`; a task reads keys from its first
//! row's `lo` on. With sinks, `m_r` also takes the head's sink logit and `sum_r` ends with
//! `+ exp(sink - m_r)` (after the keys). With a query temperature (Llama-4, Mistral), `q_r` is
//! multiplied by its position's factor (f32) as it is transposed (or, on the bf16 tasks,
//! packed), before any score. With a soft cap (Gemma-2), every score of the task becomes
//! `cap · tanh(s / cap)` ([`soft_cap`], one fixed `tanh` on every lane) before the max.
//!
//! A tile runs its keys up to its longest row; for a shorter row the extra keys get `e = 0`
//! and are skipped in the weighted sum of values (with finite values skipping them changes
//! nothing, `acc + 0·v == acc`; with a NaN value at a later position, multiplying by 0 would
//! carry it into an earlier row), so a row's bits do not depend on the tile it lands in. The
//! AVX2+FMA and AVX-512F kernels compute, per lane, exactly the operations of the portable one
//! ([`task_portable`]; f32::mul_add is a fused multiply-add everywhere), so the result does not
//! depend on the CPU's vector width either (checked in the tests).

use rayon::prelude::*;

use crate::kernels::cpu::bf16::Bf16Kernel;
use crate::kernels::cpu::vector::Unit;
use crate::kernels::plan::BatchPlan;

pub use crate::kernels::device::AttnShape;
use crate::kernels::device::{QueryTemperature, first_key};

/// Query rows per task (tokens × query heads of one kv head), at most.
const TILE_ROWS: usize = 64;
/// Query rows per task of the bf16 tile task (AMX or `vdpbf16ps`; 4 tiles of 16 rows), at most.
const AMX_ROWS: usize = 64;
/// The bf16 tile task's keys per PV step (an A tile's 32 inputs); steps start at absolute
/// multiples.
const AMX_KEY_ALIGN: usize = 32;
/// f32 lanes of one AVX register.
const LANES: usize = 8;

/// One (tile, kv head) task: tokens `t0..t0 + n` of one run.
#[derive(Debug, Clone, Copy)]
struct Task {
    t0: usize,
    n: usize,
    kv_head: usize,
}

/// f32s (or u32s) per 64-byte cache line.
const LINE: usize = 16;

/// 64 bytes on a cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u32; LINE]);

// SAFETY: a plain u32 array of 64 bytes (its alignment): no padding, any bits valid.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Line {}

/// An f32 buffer that starts on a cache line, so that rows of 16·n floats start on lines and
/// no vector load of 8 or 16 lanes at a multiple of 8 straddles two (from a large `Vec<f32>`,
/// 16 bytes past a page start, every other 8-lane load did; aligned, the f32 attention took
/// ~5% less time at 4k-token prompts on Zen 3).
#[derive(Default)]
struct LineBuf {
    lines: Vec<Line>,
    len: usize,
}

impl LineBuf {
    /// `len` floats, all zero.
    fn zeroed(&mut self, len: usize) {
        self.lines.clear();
        self.set_len(len);
    }

    /// `len` floats whose values are unspecified (each is written before it is read); grows
    /// only, so a worker's buffer is allocated once for its longest task.
    fn set_len(&mut self, len: usize) {
        lines(&mut self.lines, len.div_ceil(LINE));
        self.len = len;
    }
}

/// `len` lines, reused (grown only; no zeroing of what is rewritten).
fn lines(v: &mut Vec<Line>, len: usize) -> *mut Line {
    if v.len() < len {
        v.resize(len, Line([0; LINE]));
    }
    v.as_mut_ptr()
}

impl std::ops::Deref for LineBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl std::ops::DerefMut for LineBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// Per-worker buffers.
#[derive(Default)]
struct Scratch {
    /// Queries transposed: `[hd][rp]`.
    qt: LineBuf,
    /// Scores, then probabilities: `[len][rp]`.
    st: LineBuf,
    /// Cache offset of key j (this kv head), `[len]`.
    offsets: Vec<usize>,
    /// End (exclusive) of each row's keys, counted from the task's first key; 0 for padding
    /// rows, `[rp]`.
    lens: Vec<u32>,
    /// Start of each row's keys (its window), counted from the task's first key, `[rp]`.
    starts: Vec<u32>,
    /// Each row's sink logit (0 without sinks), `[rp]`.
    sinks: Vec<f32>,
    /// `1 / sum_r`, `[rp]`.
    inv: Vec<f32>,
    /// The AVX2 task's weighted sums of values, transposed: `[hd][rp]`.
    acc: LineBuf,
}

/// The output, written by tasks at disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (token, head) ranges of one live buffer (see `attention`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Everything a task reads.
struct Ctx<'a> {
    q: &'a [f32],
    kc: &'a [f32],
    vc: &'a [f32],
    plan: &'a BatchPlan<'a>,
    shape: AttnShape,
    group: usize,
    softmax: Softmax<'a>,
    out: OutPtr,
}

/// The softmax's variant: a sliding window or chunks of keys, one sink logit per query head,
/// a per-position query temperature.
#[derive(Debug, Clone, Copy, Default)]
pub struct Softmax<'a> {
    pub window: Option<usize>,
    pub chunk: Option<usize>,
    pub sinks: Option<&'a [f32]>,
    pub temperature: Option<QueryTemperature>,
    /// Gemma-2's `attn_logit_softcapping`: scores become `cap · tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// Only the queries at positions below it (DeepSeek Sparse Attention's `index_topk`: the
    /// sparse pass writes the others' rows); `None`: every query.
    pub dense_below: Option<usize>,
}

/// `out[t, h*hd..]` = attention of `q[t, h*hd..]` over the cached keys/values of its sequence.
/// `bf16`: a bf16 model's GEMM path; on `amx` and `avx512bf16` its attention runs on bf16
/// products (AMX tiles or `vdpbf16ps`, `attention_amx.rs`) where the CPU and head dim allow;
/// otherwise (and for f32 models, `None`) the f32 kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    plan: &BatchPlan<'_>,
    shape: AttnShape,
    softmax: Softmax<'_>,
    out: &mut Vec<f32>,
    bf16: Option<Bf16Kernel>,
) {
    let t = plan.num_tokens();
    let hd = shape.head_dim;
    let group = shape.heads / shape.kv_heads;
    assert_eq!(
        q.len(),
        t * shape.heads * hd,
        "attention: q is not [T, heads * hd]"
    );
    assert!(
        softmax.sinks.is_none_or(|s| s.len() == shape.heads),
        "attention: sinks are not [heads]"
    );
    // Every element is written by a task (or, past `dense_below`, by the sparse pass after
    // it): resizing zeroes only growth, not the reused part.
    out.resize(q.len(), 0.0);
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    let engine = bf16.and_then(|k| amx::engine(k, hd));
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let _ = bf16;
    let ctx = Ctx {
        q,
        kc,
        vc,
        plan,
        shape,
        group,
        softmax,
        out: OutPtr(out.as_mut_ptr()),
    };
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    if let Some(engine) = engine {
        let tile = (AMX_ROWS / group).max(1);
        let windowed = softmax.window.is_some() || softmax.chunk.is_some();
        let chains = amx_chains(plan, shape.kv_heads, tile, windowed, softmax.dense_below);
        chains
            .par_iter()
            .for_each_init(<(Scratch, AmxScratch)>::default, |(s, a), chain| {
                // SAFETY: `engine` came from `amx::engine` for this head dim; chains are not empty.
                unsafe { amx::run_chain(&ctx, chain, s, a, engine) };
            });
        return;
    }
    let tile = (TILE_ROWS / group).max(1);
    let tasks = plan_tasks(plan, shape.kv_heads, tile, softmax.dense_below);
    let unit = f32_unit(hd);
    tasks.par_iter().for_each_init(Scratch::default, |s, task| {
        f32_task(&ctx, task, s, unit);
    });
}

/// The widest vector unit the f32 task runs on here at head dim `hd`. Each unit computes the
/// portable task's operations per lane, so all give the same bits (module docs).
fn f32_unit(hd: usize) -> Unit {
    [Unit::Avx512, Unit::Avx2]
        .into_iter()
        .find(|&u| f32_runs(u, hd))
        .unwrap_or(Unit::Baseline)
}

/// Whether the f32 task runs on `unit` here at head dim `hd` (the SIMD tasks take head dims
/// that are multiples of 8, and AVX2's also needs FMA).
fn f32_runs(unit: Unit, hd: usize) -> bool {
    match unit {
        Unit::Baseline => true,
        Unit::Avx2 => unit.available() && has_fma() && hd.is_multiple_of(LANES),
        Unit::Avx512 => unit.available() && hd.is_multiple_of(LANES),
    }
}

/// One f32 task on `unit` (which must run here: [`f32_runs`]); `Baseline` is the portable
/// task.
fn f32_task(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch, unit: Unit) {
    assert!(
        f32_runs(unit, ctx.shape.head_dim),
        "{unit:?} does not run here"
    );
    prepare(ctx, task, s, false, true);
    match unit {
        // SAFETY: the CPU has AVX-512F and hd % 8 == 0 (asserted above).
        #[cfg(target_arch = "x86_64")]
        Unit::Avx512 => unsafe { task_avx512(ctx, task, s) },
        // SAFETY: the CPU has AVX2 and FMA and hd % 8 == 0 (asserted above).
        #[cfg(target_arch = "x86_64")]
        Unit::Avx2 => unsafe { task_avx2(ctx, task, s) },
        _ => task_portable(ctx, task, s),
    }
}

/// bf16 tile tasks (AMX or `vdpbf16ps`) per chain at most: enough to pay for packing K and V
/// once per chain, few enough that a long prompt still splits over the workers.
const AMX_CHAIN: usize = 8;

/// The AMX path's tasks (tiles of `tile` tokens × kv heads) in chains of up to [`AMX_CHAIN`]
/// consecutive tiles of one run and kv head, which share their keys' packed K and V. With a
/// window the tiles' first keys differ: one task per chain.
fn amx_chains(
    plan: &BatchPlan<'_>,
    kv_heads: usize,
    tile: usize,
    windowed: bool,
    dense_below: Option<usize>,
) -> Vec<Vec<Task>> {
    let mut runs: Vec<Vec<(usize, usize)>> = Vec::new();
    for (start, end) in dense_tiles(plan, tile, dense_below) {
        let joins = runs.last().is_some_and(|run| {
            let (first, prev_end) = (run[0].0, run[run.len() - 1].1);
            !windowed
                && run.len() < AMX_CHAIN
                && prev_end == start
                && plan.seq_of[start] == plan.seq_of[first]
                && plan.positions[start] == plan.positions[start - 1] + 1
        });
        match runs.last_mut() {
            Some(run) if joins => run.push((start, end)),
            _ => runs.push(vec![(start, end)]),
        }
    }
    let chain = |run: &[(usize, usize)], kv_head| {
        run.iter()
            .map(|&(t0, end)| Task {
                t0,
                n: end - t0,
                kv_head,
            })
            .collect()
    };
    runs.iter()
        .flat_map(|run| (0..kv_heads).map(move |h| chain(run, h)))
        .collect()
}

/// [`BatchPlan::tiles`], each cut short before its first token at a position `dense_below` or
/// past (a tile's positions are consecutive), tiles left empty dropped.
fn dense_tiles(
    plan: &BatchPlan<'_>,
    tile: usize,
    dense_below: Option<usize>,
) -> Vec<(usize, usize)> {
    let tiles = plan.tiles(tile);
    let Some(below) = dense_below else {
        return tiles;
    };
    let cut = |(start, end): (usize, usize)| {
        let end = end.min(start + below.saturating_sub(plan.positions[start]));
        (end > start).then_some((start, end))
    };
    tiles.into_iter().filter_map(cut).collect()
}

/// Runs of consecutive positions of one chunk, cut into tiles of `tile` tokens (the dense
/// queries of them: [`dense_tiles`]), × kv heads.
fn plan_tasks(
    plan: &BatchPlan<'_>,
    kv_heads: usize,
    tile: usize,
    dense_below: Option<usize>,
) -> Vec<Task> {
    let tiles = dense_tiles(plan, tile, dense_below);
    let mut tasks = Vec::with_capacity(tiles.len() * kv_heads);
    for (start, end) in tiles {
        for kv_head in 0..kv_heads {
            tasks.push(Task {
                t0: start,
                n: end - start,
                kv_head,
            });
        }
    }
    tasks
}

fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Fills the task's key offsets, row lengths and transposed queries.
/// Returns the task's key count (`len - first`). `with_offsets`: also the keys' cache offsets
/// (the AMX chain computes them once, for its last task, where they are packed).
fn prepare(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch, amx: bool, with_offsets: bool) -> usize {
    let (hd, group) = (ctx.shape.head_dim, ctx.group);
    let plan = ctx.plan;
    let rows = task.n * group;
    // The AMX task works on whole tiles of 16 rows and pairs keys from multiples of 32.
    let (row_pad, key_align) = if amx { (16, AMX_KEY_ALIGN) } else { (LANES, 1) };
    let rp = rows.div_ceil(row_pad) * row_pad;
    let len = plan.positions[task.t0 + task.n - 1] + 1;
    // A row at position p sees keys lo(p)..=p.
    let lo = |p: usize| first_key(p, ctx.softmax.window, ctx.softmax.chunk);
    let first = lo(plan.positions[task.t0]) / key_align * key_align;
    // Key offsets first..len in position order.
    let table = plan.tables[plan.seq_of[task.t0]];
    let (bs, row) = (plan.block_size, ctx.shape.kv_heads * hd);
    let head_off = task.kv_head * hd;
    if with_offsets {
        s.offsets.clear();
        s.offsets.extend((first..len).map(|j| {
            let slot = table[j / bs] as usize * bs + j % bs;
            slot * row + head_off
        }));
    }
    s.lens.clear();
    s.lens.resize(rp, 0);
    s.starts.clear();
    s.starts.resize(rp, 0);
    s.sinks.clear();
    s.sinks.resize(rp, 0.0);
    // The AMX task packs Q from its rows itself.
    if !amx {
        s.qt.zeroed(hd * rp);
    }
    let qrow = ctx.shape.heads * hd;
    for i in 0..task.n {
        let t = task.t0 + i;
        for g in 0..group {
            let r = i * group + g;
            let p = plan.positions[t];
            s.lens[r] = (p + 1 - first) as u32;
            s.starts[r] = (lo(p) - first) as u32;
            if let Some(sinks) = ctx.softmax.sinks {
                s.sinks[r] = sinks[task.kv_head * group + g];
            }
            if amx {
                continue;
            }
            let qh = &ctx.q[t * qrow + (task.kv_head * group + g) * hd..][..hd];
            let f = ctx.softmax.temperature.map(|tm| tm.factor(p));
            for (d, &v) in qh.iter().enumerate() {
                s.qt[d * rp + r] = f.map_or(v, |f| v * f);
            }
        }
    }
    // Every score a task reads is written first: no clearing.
    let keys = len - first;
    s.st.set_len(keys * rp);
    s.inv.clear();
    s.inv.resize(rp, 0.0);
    keys
}

/// Pointer to `out[t0 + r / group, (kv_head * group + r % group) * hd]`.
#[inline(always)]
fn out_row(ctx: &Ctx<'_>, task: &Task, r: usize) -> *mut f32 {
    let hd = ctx.shape.head_dim;
    let t = task.t0 + r / ctx.group;
    let h = task.kv_head * ctx.group + r % ctx.group;
    // SAFETY (of the add): t < T and h < heads, so the offset is inside `out`.
    unsafe { ctx.out.0.add(t * ctx.shape.heads * hd + h * hd) }
}

/// The reference implementation of a task (any CPU, any head_dim).
fn task_portable(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    let hd = ctx.shape.head_dim;
    let rows = task.n * ctx.group;
    let rp = s.lens.len();
    let len = s.offsets.len();
    for (j, &off) in s.offsets.iter().enumerate() {
        let k = &ctx.kc[off..off + hd];
        for r in 0..rp {
            let mut acc = 0.0f32;
            for (d, &kd) in k.iter().enumerate() {
                acc = kd.mul_add(s.qt[d * rp + r], acc);
            }
            s.st[j * rp + r] = acc * ctx.shape.scale;
        }
    }
    if let Some(cap) = ctx.softmax.softcap {
        soft_cap(&mut s.st[..len * rp], 1.0, cap);
    }
    let sinks = ctx.softmax.sinks.is_some();
    for r in 0..rp {
        let (lo, lr) = (s.starts[r] as usize, s.lens[r] as usize);
        let mut m = if sinks { s.sinks[r] } else { f32::NEG_INFINITY };
        for j in lo..lr {
            let v = s.st[j * rp + r];
            m = if m > v { m } else { v };
        }
        let mut sum = 0.0f32;
        for j in 0..len {
            let e = if j >= lo && j < lr {
                exp_neg(s.st[j * rp + r] - m)
            } else {
                0.0
            };
            s.st[j * rp + r] = e;
            sum += e;
        }
        if sinks {
            sum += exp_neg(s.sinks[r] - m);
        }
        s.inv[r] = 1.0 / sum;
    }
    for r in 0..rows {
        let o = out_row(ctx, task, r);
        for d in 0..hd {
            let mut acc = 0.0f32;
            // Only the row's own keys: a masked key's `0 · v` would still carry a NaN of a
            // later position's value into an earlier row.
            let own = (s.offsets.iter().enumerate())
                .take(s.lens[r] as usize)
                .skip(s.starts[r] as usize);
            for (j, &off) in own {
                acc = s.st[j * rp + r].mul_add(ctx.vc[off + d], acc);
            }
            // SAFETY: row r of this task, column d < hd: inside `out`, written by this task only.
            unsafe { *o.add(d) = acc * s.inv[r] };
        }
    }
}

/// Gemma-2's soft cap on every path: the same fixed `tanh` on every lane (`soft_cap.rs`), so
/// a path's scores have the same bits whatever the batch.
use super::soft_cap::soft_cap;

#[cfg(target_arch = "x86_64")]
#[path = "attention_simd.rs"]
mod simd;
#[cfg(target_arch = "x86_64")]
use simd::{task_avx2, task_avx512};

/// The AMX task's per-worker buffers (none where there is no AMX path).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
#[derive(Default)]
struct AmxScratch;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use amx::AmxScratch;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[path = "attention_amx.rs"]
mod amx;

#[path = "attention_softmax.rs"]
mod softmax;
use crate::kernels::cpu::exp::exp_neg;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
