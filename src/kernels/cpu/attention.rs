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
//! only: the max, the sum and the weighted values run over those, in key order from `lo_r`; a
//! task reads keys from its first row's `lo` on. With sinks, `m_r` also takes the head's sink
//! logit and `sum_r` ends with `+ exp(sink - m_r)` (after the keys).
//!
//! A tile runs its keys up to its longest row; for a shorter row the extra keys get `e = 0`
//! and are skipped in the weighted sum of values (with finite values skipping them changes
//! nothing, `acc + 0·v == acc`; with a NaN value at a later position, multiplying by 0 would
//! carry it into an earlier row), so a row's bits do not depend on the tile it lands in. The AVX2+FMA kernels compute, per lane,
//! exactly the operations of the portable one ([`task_portable`]; f32::mul_add is a fused
//! multiply-add everywhere), so the result does not depend on the CPU's vector width either
//! (checked in the tests).

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::kernels::plan::BatchPlan;

pub use crate::kernels::device::AttnShape;

/// Query rows per task (tokens × query heads of one kv head), at most.
const TILE_ROWS: usize = 16;
/// Query rows per task of the AMX path (4 tiles of 16 rows), at most.
const AMX_ROWS: usize = 64;
/// The AMX path's keys per PV step (an A tile's 32 inputs); steps start at absolute multiples.
const AMX_KEY_ALIGN: usize = 32;
/// f32 lanes of one AVX register.
const LANES: usize = 8;
/// Keys per score block and rows per value block of the AVX2 kernels (6 × 2 registers of
/// accumulators: 12 of the 16 ymm registers).
const BLOCK: usize = 6;

/// One (tile, kv head) task: tokens `t0..t0 + n` of one run.
#[derive(Debug, Clone, Copy)]
struct Task {
    t0: usize,
    n: usize,
    kv_head: usize,
}

/// Per-worker buffers.
#[derive(Default)]
struct Scratch {
    /// Queries transposed: `[hd][rp]`.
    qt: Vec<f32>,
    /// Scores, then probabilities: `[len][rp]`.
    st: Vec<f32>,
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

/// The softmax's variant: a sliding window of keys, one sink logit per query head.
#[derive(Debug, Clone, Copy, Default)]
pub struct Softmax<'a> {
    pub window: Option<usize>,
    pub sinks: Option<&'a [f32]>,
}

/// `out[t, h*hd..]` = attention of `q[t, h*hd..]` over the cached keys/values of its sequence.
/// `bf16_tiles`: a bf16 model on the `amx` path, whose attention runs on AMX tiles where the
/// CPU and head dim allow (`attention_amx.rs`); otherwise the f32 kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    plan: &BatchPlan<'_>,
    shape: AttnShape,
    softmax: Softmax<'_>,
    out: &mut Vec<f32>,
    bf16_tiles: bool,
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
    // Every element is written by a task: resizing zeroes only growth, not the reused part.
    out.resize(q.len(), 0.0);
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    let amx = bf16_tiles && amx::usable(hd);
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    let amx = bf16_tiles && false;
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
    if amx {
        let tile = (AMX_ROWS / group).max(1);
        let chains = amx_chains(plan, shape.kv_heads, tile, softmax.window.is_some());
        chains
            .par_iter()
            .for_each_init(<(Scratch, AmxScratch)>::default, |(s, a), chain| {
                // SAFETY: `usable` held for this head dim; chains are not empty.
                unsafe { amx::run_chain(&ctx, chain, s, a) };
            });
        return;
    }
    let tasks = plan_tasks(plan, shape.kv_heads, (TILE_ROWS / group).max(1));
    let fast = use_avx2_fma() && hd.is_multiple_of(LANES);
    tasks.par_iter().for_each_init(Scratch::default, |s, task| {
        prepare(&ctx, task, s, false, true);
        #[cfg(target_arch = "x86_64")]
        if fast {
            // SAFETY: only reached when the CPU has AVX2 and FMA, and hd % 8 == 0.
            unsafe { task_avx2(&ctx, task, s) };
            return;
        }
        let _ = fast;
        task_portable(&ctx, task, s);
    });
}

/// AMX tasks per chain at most: enough to pay for packing K and V once per chain, few enough
/// that a long prompt still splits over the workers.
const AMX_CHAIN: usize = 8;

/// The AMX path's tasks (tiles of `tile` tokens × kv heads) in chains of up to [`AMX_CHAIN`]
/// consecutive tiles of one run and kv head, which share their keys' packed K and V. With a
/// window the tiles' first keys differ: one task per chain.
fn amx_chains(
    plan: &BatchPlan<'_>,
    kv_heads: usize,
    tile: usize,
    windowed: bool,
) -> Vec<Vec<Task>> {
    let mut runs: Vec<Vec<(usize, usize)>> = Vec::new();
    for (start, end) in plan.tiles(tile) {
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

/// Runs of consecutive positions of one chunk, cut into tiles of `tile` tokens, × kv heads.
fn plan_tasks(plan: &BatchPlan<'_>, kv_heads: usize, tile: usize) -> Vec<Task> {
    let tiles = plan.tiles(tile);
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

fn use_avx2_fma() -> bool {
    static FAST: OnceLock<bool> = OnceLock::new();
    *FAST.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
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
    let lo = |p: usize| ctx.softmax.window.map_or(0, |w| (p + 1).saturating_sub(w));
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
        s.qt.clear();
        s.qt.resize(hd * rp, 0.0);
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
            for (d, &v) in qh.iter().enumerate() {
                s.qt[d * rp + r] = v;
            }
        }
    }
    // Every score a task reads is written first: grow only, no clearing. The value blocks may
    // read up to BLOCK - 1 lanes past the last row (never stored): LANES floats of slack.
    let keys = len - first;
    if s.st.len() < keys * rp + LANES {
        s.st.resize(keys * rp + LANES, 0.0);
    }
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

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// The task on AVX2+FMA: the same operations per lane as [`task_portable`].
///
/// # Safety
/// The CPU must have AVX2 and FMA; `head_dim % 8 == 0`; `prepare` ran for this task.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2(ctx: &Ctx<'_>, task: &Task, s: &mut Scratch) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let len = s.offsets.len();
    let (kc, vc) = (ctx.kc.as_ptr(), ctx.vc.as_ptr());
    let scale = _mm256_set1_ps(ctx.shape.scale);
    let (qt, st) = (s.qt.as_ptr(), s.st.as_mut_ptr());
    // SAFETY (all pointer arithmetic below): offsets[j] + hd <= cache length (slots come from
    // the checked plan); qt is [hd][rp], st is [len][rp] and every lane index is < rp.
    unsafe {
        // Scores: BLOCK keys × 16 rows (or × 8) per block, fma-chain over d.
        let mut j = 0;
        while j < len {
            let nk = (len - j).min(BLOCK);
            let mut kp = [kc; BLOCK];
            for (i, p) in kp.iter_mut().enumerate() {
                *p = kc.add(s.offsets[j + i.min(nk - 1)]);
            }
            let mut c = 0;
            while c < rp {
                if rp - c >= 2 * LANES {
                    scores_block::<2>(kp, qt.add(c), rp, hd, scale, st.add(j * rp + c), nk);
                    c += 2 * LANES;
                } else {
                    scores_block::<1>(kp, qt.add(c), rp, hd, scale, st.add(j * rp + c), nk);
                    c += LANES;
                }
            }
            j += nk;
        }
        softmax_avx2(st, rp, len, s, ctx.softmax.sinks.is_some());
        // Weighted values: BLOCK rows × 16 dims (or × 8) per block, fma-chain over keys, in
        // runs of VALUE_KEYS keys so that the values and probabilities a run reads stay in L1
        // across the blocks; between runs the partial sums wait in the output rows (an exact
        // f32 store and reload: the chain is unchanged).
        let rows = task.n * ctx.group;
        let offs = s.offsets.as_ptr();
        let mut outs = [[std::ptr::null_mut(); BLOCK]; TILE_ROWS.div_ceil(BLOCK) + 1];
        let mut invs = [[0.0f32; BLOCK]; TILE_ROWS.div_ceil(BLOCK) + 1];
        let mut lens = [[(0usize, 0usize); BLOCK]; TILE_ROWS.div_ceil(BLOCK) + 1];
        debug_assert!(rows <= TILE_ROWS.max(ctx.group));
        let blocks = rows.div_ceil(BLOCK);
        let mut block_outs = Vec::new();
        let mut block_invs = Vec::new();
        let mut block_lens = Vec::new();
        let (outs, invs, lens) = if blocks <= outs.len() {
            (
                &mut outs[..blocks],
                &mut invs[..blocks],
                &mut lens[..blocks],
            )
        } else {
            block_outs.resize(blocks, [std::ptr::null_mut(); BLOCK]);
            block_invs.resize(blocks, [0.0f32; BLOCK]);
            block_lens.resize(blocks, [(0usize, 0usize); BLOCK]);
            (
                &mut block_outs[..],
                &mut block_invs[..],
                &mut block_lens[..],
            )
        };
        for (b, ((o, v), l)) in outs
            .iter_mut()
            .zip(invs.iter_mut())
            .zip(lens.iter_mut())
            .enumerate()
        {
            let rb = b * BLOCK;
            for i in 0..(rows - rb).min(BLOCK) {
                o[i] = out_row(ctx, task, rb + i);
                v[i] = s.inv[rb + i];
                l[i] = (s.starts[rb + i] as usize, s.lens[rb + i] as usize);
            }
        }
        let mut kb = 0;
        while kb < len {
            let ke = (kb + VALUE_KEYS).min(len);
            let keys = Keys {
                offs,
                start: kb,
                end: ke,
                last: ke == len,
            };
            for (b, ((o, v), l)) in outs.iter().zip(invs.iter()).zip(lens.iter()).enumerate() {
                let rb = b * BLOCK;
                let rows_of = Rows {
                    outs: *o,
                    inv: *v,
                    lens: *l,
                    nr: (rows - rb).min(BLOCK),
                };
                let mut d = 0;
                while d < hd {
                    if hd - d >= 2 * LANES {
                        values_block::<2>(st.add(rb), rp, vc.add(d), &keys, &rows_of, d);
                        d += 2 * LANES;
                    } else {
                        values_block::<1>(st.add(rb), rp, vc.add(d), &keys, &rows_of, d);
                        d += LANES;
                    }
                }
            }
            kb = ke;
        }
    }
}

/// Keys per run of the value blocks.
const VALUE_KEYS: usize = 128;

/// A run `start..end` of keys for [`values_block`].
#[cfg(target_arch = "x86_64")]
struct Keys {
    offs: *const usize,
    start: usize,
    end: usize,
    /// The run ends the chain: scale by `1 / sum` and store the result.
    last: bool,
}

/// The rows of one value block: output rows, `1 / sum`, keys each row sees (start, end: a
/// key outside them, `0 · v`, would carry a NaN value into the row), rows in use.
#[cfg(target_arch = "x86_64")]
struct Rows {
    outs: [*mut f32; BLOCK],
    inv: [f32; BLOCK],
    lens: [(usize, usize); BLOCK],
    nr: usize,
}

/// Scores of keys `kp[..nk]` (extra pointers repeat the last key and are not stored) against
/// `C` × 8 rows starting at `qt` (row stride `rp` per d), stored at `st` (stride `rp` per key).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_block<const C: usize>(
    kp: [*const f32; BLOCK],
    qt: *const f32,
    rp: usize,
    hd: usize,
    scale: __m256,
    st: *mut f32,
    nk: usize,
) {
    // SAFETY: see `task_avx2`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; BLOCK];
        for d in 0..hd {
            let mut qv = [_mm256_setzero_ps(); C];
            for (c, v) in qv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(qt.add(d * rp + c * LANES));
            }
            for i in 0..BLOCK {
                let k = _mm256_broadcast_ss(&*kp[i].add(d));
                for c in 0..C {
                    acc[i][c] = _mm256_fmadd_ps(k, qv[c], acc[i][c]);
                }
            }
        }
        for (i, a) in acc.iter().enumerate().take(nk) {
            for (c, v) in a.iter().enumerate() {
                _mm256_storeu_ps(st.add(i * rp + c * LANES), _mm256_mul_ps(*v, scale));
            }
        }
    }
}

/// `out_i[d0 + ..C*8] += Σ_{j in run} p[j][i] · v_j[..]` for rows i < nr of a block (from 0 on
/// the first run), times `inv[i]` on the last run.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn values_block<const C: usize>(
    p: *const f32,
    rp: usize,
    v: *const f32,
    keys: &Keys,
    rows: &Rows,
    d0: usize,
) {
    let (outs, inv, nr) = (rows.outs, rows.inv, rows.nr);
    // SAFETY: see `task_avx2`; rows i >= nr of the block read padding, the next key's row or
    // the slack after the last one (inside `st`), and are never loaded or stored in `out`.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; BLOCK];
        if keys.start > 0 {
            for i in 0..nr {
                for (c, a) in acc[i].iter_mut().enumerate() {
                    *a = _mm256_loadu_ps(outs[i].add(d0 + c * LANES));
                }
            }
        }
        for j in keys.start..keys.end {
            let vj = v.add(*keys.offs.add(j));
            let mut vv = [_mm256_setzero_ps(); C];
            for (c, x) in vv.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(vj.add(c * LANES));
            }
            let pj = p.add(j * rp);
            for (i, a) in acc.iter_mut().enumerate() {
                let (start, end) = rows.lens[i];
                if j < start || j >= end {
                    continue;
                }
                let e = _mm256_broadcast_ss(&*pj.add(i));
                for (x, y) in a.iter_mut().zip(&vv) {
                    *x = _mm256_fmadd_ps(e, *y, *x);
                }
            }
        }
        for i in 0..nr {
            let s = _mm256_set1_ps(if keys.last { inv[i] } else { 1.0 });
            for (c, a) in acc[i].iter().enumerate() {
                let r = if keys.last { _mm256_mul_ps(*a, s) } else { *a };
                _mm256_storeu_ps(outs[i].add(d0 + c * LANES), r);
            }
        }
    }
}

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
#[cfg(target_arch = "x86_64")]
use softmax::softmax_avx2;

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
