//! The bf16 attention task, for bf16 models on the `amx` and `avx512bf16` paths
//! (`cpu_bf16_kernel`): QKᵀ and PV as bf16 products with f32 accumulation — AMX tile products
//! ([`Engine::Amx`]) or `vdpbf16ps` over the same packed operands ([`Engine::Dpbf16`],
//! `attention_dpbf16.rs`) — and the operations of the f32 kernel's softmax (`softmax_avx2`) in
//! between, as torch's CPU flash attention does for bf16: q, k, v and the probabilities rounded
//! to bf16 (nearest even), scores, softmax and sums in f32.
//!
//! # Per chain of tasks (one run of positions and kv head) and per task (up to `AMX_ROWS`
//! query rows)
//! 1. Once per chain, K of its keys rounded to bf16, one row per key (the A operand of
//!    `S = K · Qᵀ`, 16 keys × 32 dims per tile) and V in VNNI pairs of keys (the B operand of
//!    `O = P · V`): packing them per task cost as much as the task's tile products. Per task,
//!    Q in VNNI pairs (the B operand).
//! 2. `Sᵀ [keys][rows]` tile by tile into the scores; the f32 softmax over them `× scale`,
//!    its probabilities rounded to bf16 straight into P's A tiles (16 rows × 32 keys) in the
//!    same pass (`attention_amx_softmax.rs`).
//! 3. `O = P · V`, `× 1 / sum`.
//!
//! # Row invariance (DESIGN.md §7 a)
//! A score is one dot product over the head dim in tile order, whatever the other rows of the
//! tile. The keys of a PV step are pairs from absolute multiples of [`KEY_ALIGN`] (the task's
//! first key is rounded down to one), and a key outside a row's window or length has
//! probability 0, whose products add exactly 0: a row's output has the same bits in any task,
//! batch or chunking. (On AMX, with a NaN in a later position's value, `0 · NaN` could reach
//! earlier rows of the same sequence; such a request already carries NaN states. The
//! `vdpbf16ps` engine skips the keys a row does not see.)

use std::arch::x86_64::*;

// A `Line` holds a tile row: a tile row straddling two lines loads at a third of the rate
// (see `bf16::Tile`).
use super::{
    AMX_KEY_ALIGN as KEY_ALIGN, Ctx, Line, Scratch, Task, lines, out_row, prepare, soft_cap,
};
use crate::kernels::cpu::bf16::{
    AmxEmulated, AmxHardware, Bf16Kernel, TileUnit, amx_hardware, pairs_native, round_into,
    round_native, round32_native,
};
use softmax::softmax_into_tiles;

#[path = "attention_amx_softmax.rs"]
mod softmax;

#[path = "attention_dpbf16.rs"]
mod dpbf16;

/// Rows per tile.
const T: usize = 16;

/// Per-worker tile buffers.
#[derive(Default)]
pub(super) struct AmxScratch {
    /// K rows in bf16, `[keys][hd]`.
    k: Vec<Line>,
    /// V in B tiles: `[keys / 32][hd / 16][16 key pairs]` lines of 16 dims.
    v: Vec<Line>,
    /// Q in B tiles: `[row tile][hd / 32][16 dim pairs]` lines of 16 rows.
    q: Vec<Line>,
    /// P in A tiles: `[row tile][keys / 32][16 rows]` lines of 16 key pairs.
    p: Vec<Line>,
    /// Scores then probabilities, f32 `[keys][rp]`.
    st: Vec<Line>,
    /// One C tile (16 rows × 16 f32).
    c: Vec<Line>,
}

/// What multiplies the packed bf16 operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Engine {
    /// AMX tiles (`tdpbf16ps`): the CPU's, or `emulated` (tests, feature `amx-emu`).
    Amx { emulated: bool },
    /// AVX512-BF16 (`vdpbf16ps`), a zmm row of a tile at a time.
    Dpbf16,
}

/// The engine of a bf16 model's attention on the bf16 GEMM path `kernel`, where this CPU
/// runs it for this head dim: AMX on the `amx` path, `vdpbf16ps` on the `avx512bf16` path;
/// `None` (the f32 kernels) otherwise.
pub(super) fn engine(kernel: Bf16Kernel, hd: usize) -> Option<Engine> {
    let engine = match kernel {
        Bf16Kernel::Amx => Engine::Amx {
            emulated: !amx_hardware(),
        },
        Bf16Kernel::Avx512bf16 => Engine::Dpbf16,
        _ => return None,
    };
    let ready = hd.is_multiple_of(32)
        && kernel.available()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bf16")
        && is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && round_native();
    ready.then_some(engine)
}

/// The tasks of one chain ([`super::amx_chains`]: one run of positions and one kv head, in
/// position order). K and V are packed once, for the last task's keys: each task's keys are
/// a prefix of them (no window), and its keys past its own length get probability 0.
///
/// # Safety
/// `engine` came from [`engine`] for the head dim; the chain is not empty.
pub(super) unsafe fn run_chain(
    ctx: &Ctx<'_>,
    chain: &[Task],
    s: &mut Scratch,
    a: &mut AmxScratch,
    engine: Engine,
) {
    let Some(last) = chain.last() else { return };
    // SAFETY: (caller) the features are present.
    let mut run = || unsafe {
        let keys = prepare(ctx, last, s, true, true).div_ceil(KEY_ALIGN) * KEY_ALIGN;
        pack_k(ctx, s, a, keys);
        pack_v(ctx, s, a, keys);
        for task in chain {
            let len = prepare(ctx, task, s, true, false);
            run_tiles(ctx, task, s, a, (len, engine));
        }
    };
    match engine {
        Engine::Amx { emulated: false } => AmxHardware::with_tiles(run),
        Engine::Amx { emulated: true } => AmxEmulated::with_tiles(run),
        Engine::Dpbf16 => run(),
    }
}

/// One task of `len` keys on K and V packed for at least its keys (see the module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,fma")]
unsafe fn run_tiles(
    ctx: &Ctx<'_>,
    task: &Task,
    s: &mut Scratch,
    a: &mut AmxScratch,
    (len, engine): (usize, Engine),
) {
    let hd = ctx.shape.head_dim;
    let rp = s.lens.len();
    let keys = len.div_ceil(KEY_ALIGN) * KEY_ALIGN;
    // SAFETY: every buffer below is sized for `keys` keys, `rp` rows and `hd` dims first.
    unsafe {
        pack_q(ctx, task, a, rp);
        let st = lines(&mut a.st, keys * rp / T).cast::<f32>();
        match engine {
            Engine::Amx { emulated: false } => scores::<AmxHardware>(a, st, keys, hd, rp),
            Engine::Amx { emulated: true } => scores::<AmxEmulated>(a, st, keys, hd, rp),
            Engine::Dpbf16 => dpbf16::scores(a, st, keys, hd, rp),
        }
        // Keys len..keys (zero keys, or later keys of the chain) get probability 0, as masked
        // keys do; their values add exact zeros.
        let p = lines(&mut a.p, rp / T * keys / KEY_ALIGN * T);
        let (mut scale, sinks) = (ctx.shape.scale, ctx.softmax.sinks.is_some());
        if let Some(cap) = ctx.softmax.softcap {
            // Scaled and capped here, the softmax takes them as they are.
            soft_cap(std::slice::from_raw_parts_mut(st, keys * rp), scale, cap);
            scale = 1.0;
        }
        softmax_into_tiles(st, (rp, len, keys), scale, s, sinks, p);
        match engine {
            Engine::Amx { emulated: false } => values::<AmxHardware>(ctx, task, s, a, keys, rp),
            Engine::Amx { emulated: true } => values::<AmxEmulated>(ctx, task, s, a, keys, rp),
            Engine::Dpbf16 => dpbf16::values(ctx, task, s, a, keys),
        }
    }
}

/// K of keys `0..len` (from the cache) rounded to bf16, zero rows up to `keys`.
unsafe fn pack_k(ctx: &Ctx<'_>, s: &Scratch, a: &mut AmxScratch, keys: usize) {
    let hd = ctx.shape.head_dim;
    let k = lines(&mut a.k, keys * hd / 32);
    // SAFETY: `keys * hd` bf16 in `k`.
    let bits = unsafe { std::slice::from_raw_parts_mut(k.cast::<u16>(), keys * hd) };
    for (j, &off) in s.offsets.iter().enumerate() {
        for c in (0..hd).step_by(32) {
            round_into(
                &ctx.kc[off + c..off + c + 32],
                &mut bits[j * hd + c..j * hd + c + 32],
            );
        }
    }
    bits[s.offsets.len() * hd..].fill(0);
}

/// V in B tiles: line `(kb, dt, kk)` = dims `16 dt..` of keys `32 kb + 2 kk` (low halves) and
/// `+ 1` (high halves); keys past `len` are zero.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_v(ctx: &Ctx<'_>, s: &Scratch, a: &mut AmxScratch, keys: usize) {
    let (hd, len) = (ctx.shape.head_dim, s.offsets.len());
    let v = lines(&mut a.v, keys * hd / 32);
    let row = |j: usize, d: usize| match j < len {
        // SAFETY: offsets[j] + hd lies inside the value cache (checked plan).
        true => unsafe { _mm512_loadu_ps(ctx.vc.as_ptr().add(s.offsets[j] + d)) },
        false => _mm512_setzero_ps(),
    };
    let dts = hd / T;
    for kb in 0..keys / KEY_ALIGN {
        for dt in 0..dts {
            for kk in 0..T {
                let j = kb * KEY_ALIGN + 2 * kk;
                let w = pairs_native(row(j, dt * T), row(j + 1, dt * T));
                // SAFETY: line (kb * dts + dt) * 16 + kk < keys / 32 * dts * 16.
                unsafe { _mm512_store_si512(v.add((kb * dts + dt) * T + kk).cast(), w) };
            }
        }
    }
}

/// Q in B tiles, straight from the query rows: line `(rt, c, kk)` = rows `16 rt..` of dims
/// `32 c + 2 kk` (low) and `+ 1` (high); rows past the task's are zero. A row's 32 dims
/// (times its position's query temperature, in f32) rounded to bf16 are, in memory order, its
/// 16 dim pairs: 16 rows of them transposed give the tile (no `[hd][rp]` transpose of Q
/// first, which cost ~3% of a bf16 run).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_q(ctx: &Ctx<'_>, task: &Task, a: &mut AmxScratch, rp: usize) {
    let (hd, group) = (ctx.shape.head_dim, ctx.group);
    let rows = task.n * group;
    let q = lines(&mut a.q, rp / T * hd / 2);
    let cs = hd / 32;
    for rt in 0..rp / T {
        for c in 0..cs {
            let mut words = [_mm512_setzero_si512(); T];
            for (r, word) in words.iter_mut().enumerate() {
                let row = rt * T + r;
                if row >= rows {
                    break;
                }
                let (t, h) = (task.t0 + row / group, task.kv_head * group + row % group);
                let at = (t * ctx.shape.heads + h) * hd + c * 32;
                let x = &ctx.q[at..at + 32];
                // SAFETY: 32 floats at x.
                let (mut lo, mut hi) = unsafe {
                    (
                        _mm512_loadu_ps(x.as_ptr()),
                        _mm512_loadu_ps(x.as_ptr().add(16)),
                    )
                };
                if let Some(tm) = ctx.softmax.temperature {
                    let f = _mm512_set1_ps(tm.factor(ctx.plan.positions[t]));
                    (lo, hi) = (_mm512_mul_ps(lo, f), _mm512_mul_ps(hi, f));
                }
                *word = round32_native(lo, hi);
            }
            transpose16(&mut words);
            let tile = q.wrapping_add((rt * cs + c) * T);
            for (kk, line) in words.iter().enumerate() {
                // SAFETY: line (rt * cs + c) * 16 + kk < rp / 16 * cs * 16.
                unsafe { _mm512_store_si512(tile.add(kk).cast(), *line) };
            }
        }
    }
}

/// `Sᵀ [keys][rp] = K · Qᵀ`: per 16 keys, up to 4 row tiles at once.
///
/// # Safety
/// Inside `U::with_tiles`; the operands packed for `keys`, `hd` and `rp`.
unsafe fn scores<U: TileUnit>(a: &AmxScratch, st: *mut f32, keys: usize, hd: usize, rp: usize) {
    let (k, q) = (a.k.as_ptr().cast::<u8>(), a.q.as_ptr());
    let (cs, rts) = (hd / 32, rp / T);
    // SAFETY: K is [keys][hd] bf16, Q [rts][cs] tiles, st [keys][rp] f32, all line aligned.
    unsafe {
        for jb in (0..keys).step_by(T) {
            for rg in (0..rts).step_by(4) {
                let n = (rts - rg).min(4);
                (0..n).for_each(|i| U::zero(i));
                for c in 0..cs {
                    U::load_a(k.add((jb * hd + c * 32) * 2), hd * 2);
                    for i in 0..n {
                        U::dp_into(i, q.add(((rg + i) * cs + c) * T).cast());
                    }
                }
                for i in 0..n {
                    U::store_c(i, st.add(jb * rp + (rg + i) * T), rp * 4);
                }
            }
        }
    }
}

/// `x[i]` lane `j` ↔ `x[j]` lane `i` (32-bit lanes): interleaves of 32 and 64 bits, then of
/// 128-bit quarters.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(x: &mut [__m512i; T]) {
    let mut t = [_mm512_setzero_si512(); T];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_epi32(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(x[2 * i], x[2 * i + 1]);
    }
    for i in 0..4 {
        x[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        x[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        x[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        x[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for i in 0..2 {
        for j in 0..4 {
            let (a, b) = (x[8 * i + j], x[8 * i + j + 4]);
            t[8 * i + j] = _mm512_shuffle_i32x4::<0x88>(a, b);
            t[8 * i + j + 4] = _mm512_shuffle_i32x4::<0xdd>(a, b);
        }
    }
    for j in 0..8 {
        x[j] = _mm512_shuffle_i32x4::<0x88>(t[j], t[j + 8]);
        x[j + 8] = _mm512_shuffle_i32x4::<0xdd>(t[j], t[j + 8]);
    }
}

/// `O = P · V` per row tile, up to 4 dim tiles at once, `× 1 / sum` into the output rows.
///
/// # Safety
/// As [`scores`], and AVX-512F present.
#[target_feature(enable = "avx512f")]
unsafe fn values<U: TileUnit>(
    ctx: &Ctx<'_>,
    task: &Task,
    s: &Scratch,
    a: &mut AmxScratch,
    keys: usize,
    rp: usize,
) {
    let (hd, rows) = (ctx.shape.head_dim, task.n * ctx.group);
    let (kbs, dts) = (keys / KEY_ALIGN, hd / T);
    let c = lines(&mut a.c, T).cast::<f32>();
    let (p, v) = (a.p.as_ptr().cast::<u8>(), a.v.as_ptr());
    // SAFETY: P [rts][kbs] and V [kbs][dts] tiles, C one tile; output rows < rows.
    unsafe {
        for rt in 0..rp / T {
            for dg in (0..dts).step_by(4) {
                let n = (dts - dg).min(4);
                (0..n).for_each(|i| U::zero(i));
                for kb in 0..kbs {
                    U::load_a(p.add((rt * kbs + kb) * T * 64), 64);
                    for i in 0..n {
                        U::dp_into(i, v.add((kb * dts + dg + i) * T).cast());
                    }
                }
                for i in 0..n {
                    U::store_c(i, c, 64);
                    for r in 0..T.min(rows.saturating_sub(rt * T)) {
                        let row = rt * T + r;
                        let o = out_row(ctx, task, row).add((dg + i) * T);
                        let x = _mm512_load_ps(c.add(r * T));
                        _mm512_storeu_ps(o, _mm512_mul_ps(x, _mm512_set1_ps(s.inv[row])));
                    }
                }
            }
        }
    }
}
