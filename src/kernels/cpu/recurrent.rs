//! Recurrent layers of the hybrid models: the per-request state cache, the causal depthwise
//! conv1d, the per-(request, head) tasks of the recurrences and the gated RMSNorms (the gated
//! delta rule of Gated DeltaNet is in [`gdn`](super::gdn), the Mamba-2 selective scan in
//! [`mamba`](super::mamba)).
//!
//! # Chunk invariance (DESIGN.md §7 c)
//!
//! Both recurrences run **token by token** in f32, for prefill and decode alike: each
//! (request, head) is one task that walks its tokens in order, starting from the state its slot
//! holds (zero when the chunk starts at position 0). A token's arithmetic is therefore the same
//! whether its request was split into chunks of 7, 61 or 4096 tokens, and whatever shares the
//! batch: results are byte-identical across splits. The conv reads the last `k - 1` inputs from
//! the slot's conv state, in the same fixed order. The cost: per token and head, about
//! `7 · dk · dv` (GDN) or `5 · head_dim · d_state` (Mamba-2) flops done sequentially,
//! parallel over requests × heads, each task's loops compiled for the widest vector unit the
//! CPU has ([`vector`]; same bits on every unit).
//!
//! # No chunked form on the CPU
//! The chunked (matmul) forms that GPUs run (`kernels/cuda/recurrent_chunked.rs`) would not
//! pay here: chunked GDN does 1.15–2× the serial flops (chunks of 64, head dims 128–64) and
//! chunked Mamba-2 about as many, in GEMMs of 64 rows; the serial forms run at 25–45% of the
//! f32 FMA peak (`cargo run --release --example gemm_peak -- --recurrence-only`) and take
//! 2–5% of a hybrid's bf16 run (bench/README.md, session 30), so the best case gains a few
//! percent and costs byte-identity wherever a chunk is cut off a multiple of the chunk size.

use std::ops::Range;

use rayon::prelude::*;

use super::norm::inv_rms;
use super::vector;
use crate::kernels::device::NormGate;
use crate::kernels::plan::SeqState;

/// Conv state (`[k - 1, channels]` per slot) and recurrent state (f32) of one layer.
pub struct LayerState {
    pub conv: Vec<f32>,
    pub ssm: Vec<f32>,
    conv_per_slot: usize,
    ssm_per_slot: usize,
}

impl LayerState {
    /// Recurrent-state floats per slot.
    pub fn ssm_per_slot(&self) -> usize {
        self.ssm_per_slot
    }
}

/// Recurrent state of every recurrent layer for `slots` requests.
pub struct StateCache {
    layers: Vec<LayerState>,
    slots: usize,
}

impl StateCache {
    /// `shapes[i] = (conv floats per slot, recurrent floats per slot)` of recurrent layer i.
    pub fn new(shapes: &[(usize, usize)], slots: usize) -> Result<Self, String> {
        let alloc = |n: usize| -> Result<Vec<f32>, String> {
            let total = n.checked_mul(slots).ok_or("state cache size overflows")?;
            // Zeroed by the allocator: pages become resident when a slot is first used (as
            // the KV cache).
            bytemuck::allocation::try_zeroed_vec::<f32>(total)
                .map_err(|()| format!("cannot allocate {} bytes of recurrent state", total * 4))
        };
        let layers = shapes
            .iter()
            .map(|&(c, s)| {
                Ok(LayerState {
                    conv: alloc(c)?,
                    ssm: alloc(s)?,
                    conv_per_slot: c,
                    ssm_per_slot: s,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self { layers, slots })
    }

    pub fn num_slots(&self) -> usize {
        self.slots
    }

    /// Zeroes every layer's state of the fresh chunks' slots (a reused slot never leaks).
    pub fn reset_fresh(&mut self, seqs: &[SeqState]) {
        for s in seqs.iter().filter(|s| s.fresh()) {
            for l in &mut self.layers {
                l.conv[s.slot * l.conv_per_slot..(s.slot + 1) * l.conv_per_slot].fill(0.0);
                l.ssm[s.slot * l.ssm_per_slot..(s.slot + 1) * l.ssm_per_slot].fill(0.0);
            }
        }
    }

    /// Copies slot `from` into slot `to` in every layer (the pairs checked by the caller).
    pub fn copy_slots(&mut self, copies: &[(usize, usize)]) {
        for l in &mut self.layers {
            for &(from, to) in copies {
                let (c, s) = (l.conv_per_slot, l.ssm_per_slot);
                l.conv.copy_within(from * c..(from + 1) * c, to * c);
                l.ssm.copy_within(from * s..(from + 1) * s, to * s);
            }
        }
    }

    pub fn layer_mut(&mut self, i: usize) -> &mut LayerState {
        &mut self.layers[i]
    }
}

#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

#[inline]
pub fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// torch `softplus` (beta 1, threshold 20).
#[inline]
pub fn softplus(v: f32) -> f32 {
    if v > 20.0 { v } else { v.exp().ln_1p() }
}

/// Causal depthwise conv1d (kernel `k`, weight `[ch, k]`, optional bias) followed by SiLU
/// where `silu`, over `x` (`[T, ch]`, rows of the chunks in `seqs`). Positions before a chunk
/// come from the slot's conv state (`[k - 1, ch]` per slot, oldest first), which is then
/// advanced.
#[allow(clippy::too_many_arguments)]
pub fn causal_conv(
    x: &[f32],
    ch: usize,
    w: &[f32],
    bias: Option<&[f32]>,
    (k, silu): (usize, bool),
    seqs: &[SeqState],
    state: &mut [f32],
    out: &mut Vec<f32>,
) {
    let hist = k - 1;
    let t = x.len() / ch;
    let mut row_seq = vec![0usize; t];
    for (i, s) in seqs.iter().enumerate() {
        row_seq[s.rows.clone()].fill(i);
    }
    // `conv_row` writes every element of every row: resizing zeroes only growth.
    out.resize(x.len(), 0.0);
    let taps = taps_by_position(w, ch, k);
    let state_ro: &[f32] = state;
    out.par_chunks_mut(ch).enumerate().for_each(|(r, o)| {
        let s = &seqs[row_seq[r]];
        let local = r - s.rows.start;
        let st = &state_ro[s.slot * hist * ch..(s.slot + 1) * hist * ch];
        // Tap j reads input position local - (k-1) + j relative to the chunk start.
        let input = |j: usize| {
            let p = local + j;
            if p >= hist {
                &x[(s.rows.start + p - hist) * ch..][..ch]
            } else {
                &st[p * ch..(p + 1) * ch]
            }
        };
        vector::widest(
            #[inline(always)]
            || conv_row(o, &taps, bias, input),
        );
        if silu {
            super::exp::silu_inplace(o);
        }
    });
    // Advance each slot's window to the last k-1 inputs.
    for s in seqs {
        let st = &mut state[s.slot * hist * ch..(s.slot + 1) * hist * ch];
        let len = s.rows.len();
        let mut window = Vec::with_capacity(hist * ch);
        for p in len..len + hist {
            // position p - hist relative to the chunk start, in [len - hist, len)
            if p >= hist {
                let r = s.rows.start + p - hist;
                window.extend_from_slice(&x[r * ch..(r + 1) * ch]);
            } else {
                window.extend_from_slice(&st[p * ch..(p + 1) * ch]);
            }
        }
        st.copy_from_slice(&window);
    }
}

/// The conv weight `[ch, k]` as `[k, ch]`: each tap one contiguous row, so that a row's
/// channels vectorise in [`conv_row`].
fn taps_by_position(w: &[f32], ch: usize, k: usize) -> Vec<f32> {
    let mut taps = vec![0.0f32; k * ch];
    for (c, wc) in w.chunks_exact(k).enumerate() {
        for (j, &wj) in wc.iter().enumerate() {
            taps[j * ch + c] = wj;
        }
    }
    taps
}

/// One output row of the conv before SiLU: per channel `0 + Σ_j taps[j]·input(j)` in tap
/// order, then `+ bias` (the scalar order, whatever the vector width).
#[inline(always)]
fn conv_row<'a>(
    o: &mut [f32],
    taps: &[f32],
    bias: Option<&[f32]>,
    input: impl Fn(usize) -> &'a [f32],
) {
    let ch = o.len();
    o.fill(0.0);
    for (j, tap) in taps.chunks_exact(ch).enumerate() {
        for ((oc, &wj), &v) in o.iter_mut().zip(tap).zip(input(j)) {
            *oc += wj * v;
        }
    }
    if let Some(b) = bias {
        for (oc, &bc) in o.iter_mut().zip(b) {
            *oc += bc;
        }
    }
}

/// Runs `head(h, rows, state, out)` for every (chunk, head) of a recurrent layer, in parallel
/// and compiled for the widest vector unit ([`vector::widest`]); `state` is
/// `[slots, heads, per]`; each task writes its rows of head `h` (`dh` values each) straight
/// into `out [t, heads · dh]` through its [`HeadRows`].
pub(super) fn per_head(
    state: &mut [f32],
    (heads, per, dh): (usize, usize, usize),
    seqs: &[SeqState],
    t: usize,
    out: &mut Vec<f32>,
    head: impl Fn(usize, Range<usize>, &mut [f32], HeadRows<'_>) + Sync,
) {
    let covered = disjoint_rows(seqs, t);
    // A reused buffer: only rows no chunk writes need zeros (none in a real batch).
    out.resize(t * heads * dh, 0.0);
    if !covered {
        out.fill(0.0);
    }
    let base = OutBase(out.as_mut_ptr());
    head_tasks(state, per, heads, seqs)
        .into_par_iter()
        .for_each(|(si, h, st)| {
            let rows = seqs[si].rows.clone();
            let o = HeadRows {
                base: base.ptr(),
                heads,
                dh,
                h,
                rows: rows.clone(),
                _out: std::marker::PhantomData,
            };
            vector::widest(
                #[inline(always)]
                || head(h, rows, st, o),
            )
        });
}

/// Whether the chunks' rows cover `0..t`; panics unless they are disjoint and inside it (the
/// tasks of [`per_head`] write through raw pointers on that ground).
fn disjoint_rows(seqs: &[SeqState], t: usize) -> bool {
    let mut ranges: Vec<Range<usize>> = seqs.iter().map(|s| s.rows.clone()).collect();
    ranges.sort_by_key(|r| r.start);
    let mut end = 0;
    let mut covered = true;
    for r in &ranges {
        assert!(
            r.start >= end && r.end <= t,
            "recurrent: chunk rows overlap or exceed {t}"
        );
        covered &= r.start == end;
        end = r.end.max(r.start);
    }
    covered && end == t
}

/// `out`'s first element, shared by the tasks of [`per_head`].
#[derive(Clone, Copy)]
struct OutBase(*mut f32);

impl OutBase {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not its field).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: the tasks write disjoint parts of `out` (see `HeadRows::row`).
unsafe impl Send for OutBase {}
unsafe impl Sync for OutBase {}

/// One task's output: head `h`'s `dh` values of each row of its chunk, in `out [t, heads, dh]`.
pub(super) struct HeadRows<'a> {
    base: *mut f32,
    heads: usize,
    dh: usize,
    h: usize,
    rows: Range<usize>,
    _out: std::marker::PhantomData<&'a mut [f32]>,
}

impl HeadRows<'_> {
    /// The values of the chunk's `i`-th row.
    pub fn row(&mut self, i: usize) -> &mut [f32] {
        let r = self.rows.start + i;
        assert!(r < self.rows.end, "HeadRows: row {i} outside the chunk");
        // SAFETY: `per_head` checked that the chunks' rows are disjoint and inside `out`'s t
        // rows of `heads · dh` values; tasks differ in chunk or head, so no two address the
        // same values; `&mut self` hands out one row at a time.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.add((r * self.heads + self.h) * self.dh),
                self.dh,
            )
        }
    }
}

/// A head function's `rows` output rows of `dh` values, collected into a vector that starts as
/// NaN (tests: every value must be written).
#[cfg(test)]
pub(super) fn collect_rows(rows: usize, dh: usize, head: impl FnOnce(HeadRows<'_>)) -> Vec<f32> {
    let mut out = vec![f32::NAN; rows * dh];
    head(HeadRows {
        base: out.as_mut_ptr(),
        heads: 1,
        dh,
        h: 0,
        rows: 0..rows,
        _out: std::marker::PhantomData,
    });
    out
}

/// Splits `state` (`[slots, heads, per]`) into one mutable block per (chunk, head) task.
fn head_tasks<'a>(
    state: &'a mut [f32],
    per: usize,
    heads: usize,
    seqs: &[SeqState],
) -> Vec<(usize, usize, &'a mut [f32])> {
    let mut blocks: Vec<Option<&mut [f32]>> = state.chunks_mut(per).map(Some).collect();
    let mut tasks = Vec::with_capacity(seqs.len() * heads);
    for (si, s) in seqs.iter().enumerate() {
        for h in 0..heads {
            let b = blocks[s.slot * heads + h]
                .take()
                .expect("state slots are distinct within a batch");
            tasks.push((si, h, b));
        }
    }
    tasks
}

/// Qwen3.5 / Qwen3-Next gated norm per head: `w · (x · rsqrt(mean(x²) + eps)) · silu(z)`
/// (Kimi Delta Attention: `· sigmoid(z)`),
/// over `dv = w.len()`-wide heads of `x` (`[T, heads·dv]`) and of `z`'s T rows (each
/// `heads·dv` wide), in place on `x`.
pub fn gated_rms_norm_then_gate<'a>(
    x: &mut [f32],
    z: impl IndexedParallelIterator<Item = &'a [f32]>,
    w: &[f32],
    (eps, gate): (f64, NormGate),
) {
    let (d, rows) = (w.len(), z.len());
    if x.is_empty() || rows == 0 {
        return;
    }
    let act = match gate {
        NormGate::Silu => silu,
        NormGate::Sigmoid => sigmoid,
    };
    x.par_chunks_mut(x.len() / rows)
        .zip(z)
        .for_each(|(xr, zr)| {
            for (xh, zh) in xr.chunks_exact_mut(d).zip(zr.chunks_exact(d)) {
                let r = inv_rms(xh, eps);
                for ((v, &zi), &wi) in xh.iter_mut().zip(zh).zip(w) {
                    *v = wi * (*v * r) * act(zi);
                }
            }
        });
}

/// Mamba-2's gated norm over groups of `group_size` channels, weight `w` (`[inner]`), in place
/// on `y` (`[T, inner]`) with `z`'s T rows: `h = y · silu(z)`, then `w · rms_norm(h)`
/// (Nemotron-H, Bamba, Granite 4.0); or, `norm_first` (Falcon-H1's `mamba_norm_before_gate`),
/// `w · rms_norm(y)`, then `· silu(z)`.
pub fn gated_grouped_rms_norm<'a>(
    y: &mut [f32],
    z: impl IndexedParallelIterator<Item = &'a [f32]>,
    (w, group_size, eps): (&[f32], usize, f64),
    norm_first: bool,
) {
    let inner = w.len();
    y.par_chunks_mut(inner).zip(z).for_each(|(yr, zr)| {
        if !norm_first {
            gate(yr, zr);
        }
        for (yg, wg) in yr
            .chunks_exact_mut(group_size)
            .zip(w.chunks_exact(group_size))
        {
            let r = inv_rms(yg, eps);
            for (v, &wi) in yg.iter_mut().zip(wg) {
                *v = wi * (*v * r);
            }
        }
        if norm_first {
            gate(yr, zr);
        }
    });
}

/// `y · silu(z)` in place on `y` (`[T, width]`), with `z`'s T rows (Falcon-H1's Mamba-2
/// output without its norm).
pub fn silu_gate<'a>(
    y: &mut [f32],
    z: impl IndexedParallelIterator<Item = &'a [f32]>,
    width: usize,
) {
    y.par_chunks_mut(width)
        .zip(z)
        .for_each(|(yr, zr)| gate(yr, zr));
}

/// `y · silu(z)` of one row.
fn gate(y: &mut [f32], z: &[f32]) {
    for (v, &zi) in y.iter_mut().zip(z) {
        *v *= silu(zi);
    }
}

#[cfg(test)]
#[path = "recurrent_tests.rs"]
mod tests;
