//! The bf16 attention's two products on AVX512-BF16 (`vdpbf16ps`), for CPUs with that unit
//! and no AMX (AMD Zen 4 / Zen 5, Intel Cooper Lake): the operands the AMX engine packs (K rows,
//! Q and V in VNNI pairs, P in pairs of keys), read a zmm row at a time instead of a tile at a
//! time. One `vdpbf16ps` adds one bf16 pair's products per lane into an f32 accumulator.
//!
//! # Fixed arithmetic (DESIGN.md §7 a)
//! - A score is one accumulator over the head dim's pairs in order, whatever the other rows or
//!   keys of its block.
//! - A row's output dims are one accumulator over the row's own key pairs, in key order, from
//!   the pair holding its first key to the pair holding its last: a pair half outside the
//!   row's keys is multiplied with a zeroed value half (its probability is 0 already), and
//!   pairs wholly outside are skipped. So a row's bits do not depend on its task, batch or
//!   chunking, and a NaN value reaches only the rows that see its key (unlike `0 · NaN`).

use std::arch::x86_64::*;

use super::{AmxScratch, Ctx, Line, Scratch, T, Task, out_row};

/// Rows per block of the value product (8 rows × 2 dim tiles: 16 accumulators).
const RB: usize = 8;
/// Dim tiles (16 dims each) per block of the value product; head dims are multiples of 32.
const DB: usize = 2;

/// Pairs of keys per 32-key step.
const PAIRS: usize = 16;

#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512 bits of plain data.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// `Sᵀ [keys][rp] = K · Qᵀ`, `keys` a multiple of 32, `rp` of 16: up to 4 row tiles at a time.
///
/// # Safety
/// AVX512-F and AVX512-BF16 are present; `a.k` holds `keys × hd` bf16, `a.q` the task's Q
/// tiles, `st` `keys × rp` f32 on a cache line.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn scores(a: &AmxScratch, st: *mut f32, keys: usize, hd: usize, rp: usize) {
    let rts = rp / T;
    for rt0 in (0..rts).step_by(4) {
        let at = (rt0, keys, hd, rp);
        // SAFETY: (caller) row tiles rt0.. < rts.
        unsafe {
            match rts - rt0 {
                1 => scores_rt::<1, 8>(a, st, at),
                2 => scores_rt::<2, 8>(a, st, at),
                3 => scores_rt::<3, 4>(a, st, at),
                _ => scores_rt::<4, 4>(a, st, at),
            }
        }
    }
}

/// [`scores`] for the `RT` row tiles from `rt0`, `JB` keys per block (`JB` divides 32).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn scores_rt<const RT: usize, const JB: usize>(
    a: &AmxScratch,
    st: *mut f32,
    (rt0, keys, hd, rp): (usize, usize, usize, usize),
) {
    let (k, q) = (a.k.as_ptr().cast::<u16>(), a.q.as_ptr());
    let cs = hd / 32;
    for j0 in (0..keys).step_by(JB) {
        let mut acc = [[_mm512_setzero_ps(); RT]; JB];
        for c in 0..cs {
            for kk in 0..PAIRS {
                // SAFETY: Q tile (rt0 + rt, c) line kk lies in `a.q` (rp / 16 tiles × cs); K
                // row j's dim pair 32 c + 2 kk lies in `a.k` (j < keys).
                unsafe {
                    let mut qv = [bh(_mm512_setzero_si512()); RT];
                    for (rt, qv) in qv.iter_mut().enumerate() {
                        *qv = bh(_mm512_load_si512(
                            q.add(((rt0 + rt) * cs + c) * T + kk).cast(),
                        ));
                    }
                    for (jj, acc) in acc.iter_mut().enumerate() {
                        let at = (j0 + jj) * hd + c * 32 + 2 * kk;
                        let pair = k.add(at).cast::<i32>().read_unaligned();
                        let kv = bh(_mm512_set1_epi32(pair));
                        for (acc, &qv) in acc.iter_mut().zip(&qv) {
                            *acc = _mm512_dpbf16_ps(*acc, kv, qv);
                        }
                    }
                }
            }
        }
        for (jj, acc) in acc.iter().enumerate() {
            for (rt, &x) in acc.iter().enumerate() {
                // SAFETY: score (j0 + jj, 16 (rt0 + rt)..) inside st [keys][rp], 64-byte aligned.
                unsafe { _mm512_store_ps(st.add((j0 + jj) * rp + (rt0 + rt) * T), x) };
            }
        }
    }
}

/// The pairs a row adds (module docs): `full` pairs whole, and the pairs holding its first
/// key (`head`, low half masked) and its last key (`tail`, high half masked) when those keys
/// are odd / even.
struct RowPairs {
    head: Option<usize>,
    full: std::ops::Range<usize>,
    tail: Option<usize>,
}

impl RowPairs {
    /// Keys `start..len` (counted from the task's first key, a multiple of 32).
    fn of(start: usize, len: usize) -> Self {
        if start >= len {
            return Self {
                head: None,
                full: 0..0,
                tail: None,
            };
        }
        let head = (start % 2 == 1).then_some(start / 2);
        let tail = (len % 2 == 1).then_some(len / 2);
        // (With start odd and len odd, len >= start + 2: head and tail are different pairs.)
        let first = start.div_ceil(2);
        let end = (len / 2).max(first);
        Self {
            head,
            full: first..end,
            tail,
        }
    }
}

/// `O = P · V`, `× 1 / sum` into the output rows (see the module docs for which pairs a row
/// adds).
///
/// # Safety
/// AVX512-F and AVX512-BF16 are present; `a.p` and `a.v` hold the task's P tiles and V for
/// `keys` keys (a multiple of 32); `s` is the task's prepared scratch.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn values(ctx: &Ctx<'_>, task: &Task, s: &Scratch, a: &AmxScratch, keys: usize) {
    let (hd, rows) = (ctx.shape.head_dim, task.n * ctx.group);
    let (kbs, dts) = (keys / 32, hd / T);
    let (p, v) = (a.p.as_ptr().cast::<u32>(), a.v.as_ptr());
    let ranges: Vec<RowPairs> = (0..rows)
        .map(|r| RowPairs::of(s.starts[r] as usize, s.lens[r] as usize))
        .collect();
    // P's u32 of row r's pair 0 (pair q is `p_offset(q)` further).
    let p_row = |r: usize| ((r / T) * kbs * T + r % T) * 16;
    // SAFETY: q < keys / 2 and dt < dts: inside V's tiles, 64-byte aligned lines.
    let v_line = |q: usize, dt: usize| unsafe { v.add(((q / PAIRS) * dts + dt) * T + q % PAIRS) };
    for r0 in (0..rows).step_by(RB) {
        let block = &ranges[r0..(r0 + RB).min(rows)];
        let common = common_pairs(block);
        // Rows past the task's are padding rows of P (r0 + RB <= rp): the shared pairs run
        // over all RB rows, those are computed and not stored.
        let rows_p: [usize; RB] = std::array::from_fn(|i| p_row(r0 + i));
        // SAFETY: (every read below) rows r0 + i < rp and pairs q < keys / 2: inside P.
        let pair = |i: usize, q: usize| unsafe { p.add(rows_p[i] + p_offset(q)).read() as i32 };
        for d0 in (0..dts).step_by(DB) {
            let v_of = |q: usize| move |dt: usize| v_line(q, d0 + dt);
            // Each row's own pairs go into `own` (indexed by row: memory), the shared ones
            // into a copy that only constant indices reach (registers).
            let mut own = [[_mm512_setzero_ps(); DB]; RB];
            for (i, (rg, acc)) in block.iter().zip(own.iter_mut()).enumerate() {
                // SAFETY: pairs < keys / 2, dims < hd (the closures' bounds).
                unsafe {
                    if let Some(h) = rg.head {
                        add_pair(acc, pair(i, h), v_of(h), KEEP_HIGH);
                    }
                    for q in rg.full.start..common.start.max(rg.full.start) {
                        add_pair(acc, pair(i, q), v_of(q), ALL);
                    }
                }
            }
            // SAFETY: as above.
            own = unsafe { shared_pairs(own, common.clone(), |q| v_line(q, d0), (p, &rows_p)) };
            for (i, (rg, acc)) in block.iter().zip(own.iter_mut()).enumerate() {
                // SAFETY: as above.
                unsafe {
                    for q in common.end.max(rg.full.start)..rg.full.end {
                        add_pair(acc, pair(i, q), v_of(q), ALL);
                    }
                    if let Some(t) = rg.tail {
                        add_pair(acc, pair(i, t), v_of(t), KEEP_LOW);
                    }
                }
                let row = r0 + i;
                let inv = _mm512_set1_ps(s.inv[row]);
                for (dt, &x) in acc.iter().enumerate() {
                    // SAFETY: row < rows and dims (d0 + dt) * 16.. < hd of this task's output.
                    unsafe {
                        let o = out_row(ctx, task, row).add((d0 + dt) * T);
                        _mm512_storeu_ps(o, _mm512_mul_ps(x, inv));
                    }
                }
            }
        }
    }
}

/// `acc[i] += Σ_q P[row i, pair q] · V[pair q]` over the pairs `common` for all [`RB`] rows
/// (`rows_p[i]`: the u32 offset of row i's pair 0 in `p`), the [`DB`] dim tiles whose first
/// line of pair q is `v(q)`.
///
/// # Safety
/// AVX512-F and AVX512-BF16 are present; every P and V read is inside its buffer.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn shared_pairs(
    mut acc: [[__m512; DB]; RB],
    common: std::ops::Range<usize>,
    v: impl Fn(usize) -> *const Line,
    (p, rows_p): (*const u32, &[usize; RB]),
) -> [[__m512; DB]; RB] {
    for q in common {
        let (vp, at) = (v(q), p_offset(q));
        let mut vq = [bh(_mm512_setzero_si512()); DB];
        for (dt, vq) in vq.iter_mut().enumerate() {
            // SAFETY: (caller) dim tile dt's line of pair q, T lines apart.
            *vq = bh(unsafe { _mm512_load_si512(vp.add(dt * T).cast()) });
        }
        for (acc, &row) in acc.iter_mut().zip(rows_p) {
            // SAFETY: (caller).
            let pq = bh(_mm512_set1_epi32(unsafe { p.add(row + at).read() } as i32));
            for (acc, &vq) in acc.iter_mut().zip(&vq) {
                *acc = _mm512_dpbf16_ps(*acc, pq, vq);
            }
        }
    }
    acc
}

/// Pair `q` of a P row, in u32 from its pair 0: `q / 16` tiles (16 lines of 16) later, `q % 16`
/// in.
fn p_offset(q: usize) -> usize {
    (q / PAIRS) * T * 16 + q % PAIRS
}

/// Every lane's pair kept.
const ALL: i32 = -1;
/// The high (odd) key of each pair kept, the low one zeroed (a row's first key is odd).
const KEEP_HIGH: i32 = 0xffff_0000_u32 as i32;
/// The low (even) key of each pair kept, the high one zeroed (a row's last key is even).
const KEEP_LOW: i32 = 0x0000_ffff;

/// The pairs every row of `block` adds whole (empty if they share none): the block runs
/// them together, each row its own pairs before and after alone, so a row's pair order is
/// its own whatever its block.
fn common_pairs(block: &[RowPairs]) -> std::ops::Range<usize> {
    let start = block.iter().map(|r| r.full.start).max().unwrap_or(0);
    let end = block.iter().map(|r| r.full.end).min().unwrap_or(0);
    // (A row's head pair lies before its full pairs, so before the common ones too.)
    if start >= end {
        return 0..0;
    }
    start..end
}

/// `acc[dt] += P pair · (V pair of dim tile dt & mask)` for the block's dim tiles.
///
/// # Safety
/// AVX512-F and AVX512-BF16 are present; `v(dt)` addresses a 64-byte aligned line.
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn add_pair(acc: &mut [__m512; DB], p: i32, v: impl Fn(usize) -> *const Line, mask: i32) {
    let (p, m) = (bh(_mm512_set1_epi32(p)), _mm512_set1_epi32(mask));
    for (dt, acc) in acc.iter_mut().enumerate() {
        // SAFETY: (caller).
        let vq = unsafe { _mm512_load_si512(v(dt).cast()) };
        *acc = _mm512_dpbf16_ps(*acc, p, bh(_mm512_and_si512(vq, m)));
    }
}
