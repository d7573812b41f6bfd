//! The chunked forms of the Gated DeltaNet and Mamba-2 recurrences (chunked.cu): the blocks a
//! batch's chunks are cut into, and the launchers. Which form runs is [`Recurrence`]
//! (`HSX_CUDA_RECURRENT=serial` keeps the token-serial kernels, for A/B).
//!
//! A block is the rows of one chunk inside one window of [`CHUNK`] absolute positions, so a
//! request's blocks do not move when the scheduler splits its prefill at a multiple of
//! [`CHUNK`]; a split elsewhere gives two partial blocks, which agree with the whole one within
//! f32 rounding. CUDA files are within rounding across chunkings anyway (cuBLAS), not
//! byte-identical.

use std::sync::OnceLock;

use super::context::{CudaError, CudaResult, DevBuf, Gpu, LaunchConfig, launch};
use super::ops::i32_of;
use super::recurrent::{DevSeqs, GdnIo, MambaIo, scan_cfg, u32_of};
use crate::kernels::plan::SeqState;

/// Rows per block: `GC` of chunked.cu (a test reads it there).
pub const CHUNK: usize = 64;
/// Threads per block of the chunked kernels (`GC_THREADS`).
const THREADS: u32 = 128;

/// Which form of the recurrences runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recurrence {
    /// Token by token (gated_delta.cu, mamba2.cu).
    Serial,
    /// In blocks of [`CHUNK`] rows (chunked.cu), the default.
    Chunked,
}

impl Recurrence {
    /// `HSX_CUDA_RECURRENT` (`serial` or `chunked`), read once; chunked when unset.
    pub fn from_env() -> Self {
        static CHOICE: OnceLock<Recurrence> = OnceLock::new();
        *CHOICE.get_or_init(|| match std::env::var("HSX_CUDA_RECURRENT").as_deref() {
            Ok("serial") => Recurrence::Serial,
            _ => Recurrence::Chunked,
        })
    }
}

/// The blocks of a batch: each block's first row and length, and each chunk's first block and
/// block count (chunks in batch order, their blocks in position order).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blocks {
    pub row: Vec<i32>,
    pub len: Vec<i32>,
    pub first: Vec<i32>,
    pub count: Vec<i32>,
}

impl Blocks {
    /// Cuts every chunk at the absolute positions that are multiples of [`CHUNK`].
    pub fn of(seqs: &[SeqState]) -> CudaResult<Self> {
        let mut b = Blocks::default();
        for s in seqs {
            b.first.push(i32_of(b.row.len(), "blocks")?);
            let (mut row, mut pos) = (s.rows.start, s.start);
            while row < s.rows.end {
                let n = (CHUNK - pos % CHUNK).min(s.rows.end - row);
                b.row.push(i32_of(row, "row")?);
                b.len.push(i32_of(n, "block length")?);
                row += n;
                pos += n;
            }
            b.count
                .push(i32_of(b.row.len(), "blocks")? - b.first.last().copied().unwrap_or(0));
        }
        Ok(b)
    }
}

/// [`Blocks`] on the device.
pub struct DevBlocks {
    pub num: usize,
    row: DevBuf<i32>,
    len: DevBuf<i32>,
    first: DevBuf<i32>,
    count: DevBuf<i32>,
}

impl DevBlocks {
    pub fn new(gpu: &Gpu, seqs: &[SeqState]) -> CudaResult<Self> {
        let b = Blocks::of(seqs)?;
        Ok(Self {
            num: b.row.len(),
            row: gpu.upload(&b.row)?,
            len: gpu.upload(&b.len)?,
            first: gpu.upload(&b.first)?,
            count: gpu.upload(&b.count)?,
        })
    }
}

/// One block of [`THREADS`] per (block, head).
fn per_block_cfg(blocks: usize, heads: usize) -> CudaResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32_of(blocks, "blocks")?, u32_of(heads, "heads")?, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The gated delta rule in blocks (q and k already normalised); `stride` is the qkv row
/// width. Scratch: W, U (then v_new) and the blocks' log-decays.
pub fn gated_delta(gpu: &Gpu, g: &GdnIo, seqs: &DevSeqs, stride: i32) -> CudaResult<()> {
    let (t, blk) = (seqs.num_tokens, &seqs.blocks);
    let w: DevBuf<f32> = gpu.zeros(t * g.nv * g.dk)?;
    let u: DevBuf<f32> = gpu.zeros(t * g.nv * g.dv)?;
    let decay: DevBuf<f32> = gpu.zeros(t * g.nv)?;
    let (nk, nv) = (i32_of(g.nk, "nk")?, i32_of(g.nv, "nv")?);
    let (dk, dv) = (i32_of(g.dk, "dk")?, i32_of(g.dv, "dv")?);
    let ba_stride = i32_of(g.ba_stride, "b/a stride")?;
    launch!(
        gpu,
        "gdn_chunk_prep_f32",
        per_block_cfg(blk.num, g.nv)?,
        g.qkv,
        stride,
        g.b,
        g.a,
        ba_stride,
        g.neg_a,
        g.dt_bias,
        blk.row.ptr(),
        blk.len.ptr(),
        w.ptr(),
        u.ptr(),
        decay.ptr(),
        nk,
        nv,
        dk,
        dv
    )?;
    launch!(
        gpu,
        "gdn_chunk_state_f32",
        scan_cfg((g.dv, "dv blocks"), g.nv, seqs.num_seqs)?,
        g.qkv,
        stride,
        w.ptr(),
        u.ptr(),
        decay.ptr(),
        g.state,
        seqs.slots(),
        blk.first.ptr(),
        blk.count.ptr(),
        blk.row.ptr(),
        blk.len.ptr(),
        g.out,
        nk,
        nv,
        dk,
        dv
    )?;
    launch!(
        gpu,
        "gdn_chunk_out_f32",
        per_block_cfg(blk.num, g.nv)?,
        g.qkv,
        stride,
        u.ptr(),
        decay.ptr(),
        blk.row.ptr(),
        blk.len.ptr(),
        g.out,
        nk,
        nv,
        dk,
        dv
    )
}

/// The Mamba-2 scan in blocks; `stride` is the xBC row width. Scratch: dt and the blocks'
/// log-decays.
pub fn mamba2_scan(gpu: &Gpu, m: &MambaIo, seqs: &DevSeqs, stride: i32) -> CudaResult<()> {
    let (t, blk) = (seqs.num_tokens, &seqs.blocks);
    let dts: DevBuf<f32> = gpu.zeros(t * m.heads)?;
    let acum: DevBuf<f32> = gpu.zeros(t * m.heads)?;
    let geometry = [
        i32_of(m.heads, "heads")?,
        i32_of(m.head_dim, "head_dim")?,
        i32_of(m.d_state, "d_state")?,
        i32_of(m.groups, "groups")?,
    ];
    let [heads, head_dim, d_state, groups] = geometry;
    let items = blk.num.checked_mul(m.heads).ok_or_else(|| {
        CudaError::Invalid(format!("{} blocks x {} heads overflow", blk.num, m.heads))
    })?;
    let prep_cfg = LaunchConfig {
        grid_dim: (
            u32_of(items.div_ceil(THREADS as usize).max(1), "blocks")?,
            1,
            1,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        gpu,
        "mamba2_chunk_prep_f32",
        prep_cfg,
        m.dt,
        i32_of(m.dt_stride, "dt stride")?,
        m.neg_a,
        m.dt_bias,
        m.dt_min,
        blk.row.ptr(),
        blk.len.ptr(),
        dts.ptr(),
        acum.ptr(),
        i32_of(blk.num, "blocks")?,
        heads
    )?;
    launch!(
        gpu,
        "mamba2_chunk_state_f32",
        scan_cfg((m.head_dim, "head_dim blocks"), m.heads, seqs.num_seqs)?,
        m.xbc,
        stride,
        dts.ptr(),
        acum.ptr(),
        m.d,
        m.state,
        seqs.slots(),
        blk.first.ptr(),
        blk.count.ptr(),
        blk.row.ptr(),
        blk.len.ptr(),
        m.y,
        heads,
        head_dim,
        d_state,
        groups
    )?;
    launch!(
        gpu,
        "mamba2_chunk_out_f32",
        per_block_cfg(blk.num, m.heads)?,
        m.xbc,
        stride,
        dts.ptr(),
        acum.ptr(),
        blk.row.ptr(),
        blk.len.ptr(),
        m.y,
        heads,
        head_dim,
        d_state,
        groups
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: std::ops::Range<usize>, start: usize) -> SeqState {
        SeqState {
            rows,
            slot: 0,
            start,
        }
    }

    /// Blocks end at absolute multiples of [`CHUNK`], whatever row a chunk starts at.
    #[test]
    fn blocks_follow_absolute_positions() {
        let b = Blocks::of(&[seq(0..150, 0), seq(150..151, 7), seq(151..251, 60)]).unwrap();
        assert_eq!(b.row, [0, 64, 128, 150, 151, 155, 219]);
        assert_eq!(b.len, [64, 64, 22, 1, 4, 64, 32]);
        assert_eq!(b.first, [0, 3, 4]);
        assert_eq!(b.count, [3, 1, 3]);
        assert_eq!(Blocks::of(&[]).unwrap(), Blocks::default());
    }

    /// `CHUNK` is chunked.cu's `GC`, the size of its shared-memory tiles.
    #[test]
    fn chunk_is_the_kernels_block() {
        let src = include_str!("chunked.cu");
        assert!(
            src.contains(&format!("#define GC {CHUNK} ")),
            "chunked.cu's GC is not {CHUNK}"
        );
        assert!(src.contains(&format!("#define GC_THREADS {THREADS}\n")));
    }
}

#[cfg(test)]
#[path = "recurrent_chunked_tests.rs"]
mod recurrent_chunked_tests;
