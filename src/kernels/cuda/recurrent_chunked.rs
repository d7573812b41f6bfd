//! The chunked forms of the Gated DeltaNet and Mamba-2 recurrences (chunked.cu, and the state
//! passes on the tensor cores in chunked_mma.cu): the blocks a batch's chunks are cut into, and
//! the launchers. Which form runs is [`Recurrence`].
//!
//! A block is the rows of one chunk inside one window of [`CHUNK`] absolute positions, so a
//! request's blocks do not move when the scheduler splits its prefill at a multiple of
//! [`CHUNK`]; a split elsewhere gives two partial blocks, which agree with the whole one within
//! f32 rounding. CUDA files are within rounding across chunkings anyway (cuBLAS), not
//! byte-identical.

use std::sync::OnceLock;

use super::context::{CudaError, CudaResult, DevBuf, Gpu, LaunchConfig, launch};
use super::ops::i32_of;
use super::recurrent::{DevSeqs, GdnIo, MambaIo, scan_cfg, state_cols_cfg, u32_of};
use crate::kernels::dtype::WeightDtype;
use crate::kernels::plan::{RECURRENT_BLOCK, SeqState};

/// Rows per block: `GC` of chunked.cu and `CM_ROWS` of chunked_mma.cu (a test reads both).
pub const CHUNK: usize = RECURRENT_BLOCK;
/// Threads per block of the chunked kernels (`GC_THREADS`, `CM_THREADS`).
const THREADS: u32 = 128;
/// State columns per block of the tensor-core state passes (`CM_COLS`).
const MMA_COLS: usize = 32;
/// Largest key dim (d_state) of the tensor-core state passes (`CM_MAXK`).
const MMA_MAX_K: usize = 128;

/// Which form of the recurrences runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recurrence {
    /// Token by token (gated_delta.cu, mamba2.cu).
    Serial,
    /// In blocks of [`CHUNK`] rows (chunked.cu), f32 on the CUDA cores.
    Chunked,
    /// In blocks, the state passes' products on the tensor cores with bf16 operands and f32
    /// accumulation (chunked_mma.cu) where the key dim allows ([`Recurrence::tensor_fits`]),
    /// the rest as [`Recurrence::Chunked`].
    Tensor,
}

impl Recurrence {
    /// `HSX_CUDA_RECURRENT` (`serial`, `chunked` or `tensor`); unset: `tensor` for bf16
    /// weights on sm_80 or newer (the state pass's products in bf16, as flash-linear-attention,
    /// which vLLM and transformers run on GPUs, computes them), else `chunked` (f32 models keep
    /// f32 products: their tolerance is 1e-4).
    pub fn pick(dtype: WeightDtype, compute_capability: (i32, i32)) -> Self {
        static FORCED: OnceLock<Option<Recurrence>> = OnceLock::new();
        let forced = FORCED.get_or_init(|| match std::env::var("HSX_CUDA_RECURRENT").as_deref() {
            Ok("serial") => Some(Recurrence::Serial),
            Ok("chunked") => Some(Recurrence::Chunked),
            Ok("tensor") => Some(Recurrence::Tensor),
            Ok(other) => {
                tracing::warn!(
                    value = other,
                    "HSX_CUDA_RECURRENT is not serial, chunked or tensor: ignored"
                );
                None
            }
            Err(_) => None,
        });
        forced.unwrap_or_else(|| Self::default_for(dtype, compute_capability))
    }

    fn default_for(dtype: WeightDtype, compute_capability: (i32, i32)) -> Self {
        if dtype == WeightDtype::Bf16 && compute_capability >= (8, 0) {
            Recurrence::Tensor
        } else {
            Recurrence::Chunked
        }
    }

    /// Whether the tensor-core state pass takes a key dim (d_state) of `dk`.
    pub fn tensor_fits(dk: usize) -> bool {
        dk > 0 && dk.is_multiple_of(16) && dk <= MMA_MAX_K
    }

    /// The state pass `self` runs at key dim `dk`: the tensor-core kernel's name and grid
    /// (columns / [`MMA_COLS`] blocks), or the f32 one's.
    fn state_pass(
        self,
        dk: usize,
        f32_name: &'static str,
        mma_name: &'static str,
        (cols, heads, seqs): (usize, usize, usize),
    ) -> CudaResult<(&'static str, LaunchConfig)> {
        if self == Recurrence::Tensor && Self::tensor_fits(dk) {
            let cfg = state_cols_cfg((cols, "column blocks"), MMA_COLS, heads, seqs)?;
            return Ok((mma_name, cfg));
        }
        Ok((f32_name, scan_cfg((cols, "column blocks"), heads, seqs)?))
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

/// Heads one block of threads of the intra-block output kernels takes at most: the heads of a
/// key head (Gated DeltaNet) or group (Mamba-2) share one Gram tile, so each block computes it
/// once for this many; capped so that a model with one group (128 heads) still spreads over
/// the SMs.
const OUT_HEADS: usize = 8;

/// The intra-block output kernels' grid, (blocks, `units` key heads or groups, parts of a
/// unit's `heads`), and the heads per block of threads.
fn out_cfg(blocks: usize, units: usize, heads: usize) -> CudaResult<(LaunchConfig, i32)> {
    let per_unit = heads / units.max(1);
    let hpc = per_unit.clamp(1, OUT_HEADS);
    let cfg = LaunchConfig {
        grid_dim: (
            u32_of(blocks, "blocks")?,
            u32_of(units, "key heads or groups")?,
            u32_of(per_unit.div_ceil(hpc), "heads")?,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    Ok((cfg, i32_of(hpc, "heads")?))
}

/// The gated delta rule in blocks (q and k already normalised); `stride` is the qkv row
/// width. Scratch: W, U (then v_new) and the blocks' log-decays.
pub fn gated_delta(
    gpu: &Gpu,
    g: &GdnIo,
    seqs: &DevSeqs,
    stride: i32,
    form: Recurrence,
) -> CudaResult<()> {
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
        dv,
        g.beta_scale
    )?;
    let (state_pass, state_cfg) = form.state_pass(
        g.dk,
        "gdn_chunk_state_f32",
        "gdn_chunk_state_mma",
        (g.dv, g.nv, seqs.num_seqs),
    )?;
    launch!(
        gpu,
        state_pass => "gdn_chunk_state_f32",
        state_cfg,
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
    let (out_cfg, hpc) = out_cfg(blk.num, g.nk, g.nv)?;
    launch!(
        gpu,
        "gdn_chunk_out_f32",
        out_cfg,
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
        dv,
        hpc
    )
}

/// The Mamba-2 scan in blocks; `stride` is the xBC row width. Scratch: dt and the blocks'
/// log-decays.
pub fn mamba2_scan(
    gpu: &Gpu,
    m: &MambaIo,
    seqs: &DevSeqs,
    stride: i32,
    form: Recurrence,
) -> CudaResult<()> {
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
    let (state_pass, state_cfg) = form.state_pass(
        m.d_state,
        "mamba2_chunk_state_f32",
        "mamba2_chunk_state_mma",
        (m.head_dim, m.heads, seqs.num_seqs),
    )?;
    launch!(
        gpu,
        state_pass => "mamba2_chunk_state_f32",
        state_cfg,
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
    let (out_cfg, hpc) = out_cfg(blk.num, m.groups, m.heads)?;
    launch!(
        gpu,
        "mamba2_chunk_out_f32",
        out_cfg,
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
        groups,
        hpc
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

    /// The constants here are the kernels': chunked.cu's `GC` and `GC_THREADS`,
    /// chunked_mma.cu's `CM_ROWS`, `CM_THREADS`, `CM_COLS` and `CM_MAXK`.
    #[test]
    fn constants_are_the_kernels() {
        let f32_src = include_str!("chunked.cu");
        assert!(f32_src.contains(&format!("#define GC {CHUNK} ")));
        assert!(f32_src.contains(&format!("#define GC_THREADS {THREADS}\n")));
        let mma_src = include_str!("chunked_mma.cu");
        for (name, v) in [
            ("CM_ROWS", CHUNK),
            ("CM_THREADS", THREADS as usize),
            ("CM_COLS", MMA_COLS),
            ("CM_MAXK", MMA_MAX_K),
        ] {
            assert!(
                mma_src.contains(&format!("#define {name} {v}")),
                "chunked_mma.cu's {name} is not {v}"
            );
        }
    }

    /// The intra-block output kernels: one block of threads per (block, key head or group,
    /// up to OUT_HEADS of its heads).
    #[test]
    fn out_grid_shares_a_gram_tile_over_heads() {
        let grid = |b, units, heads| {
            let (cfg, hpc) = out_cfg(b, units, heads).unwrap();
            (cfg.grid_dim, hpc)
        };
        assert_eq!(grid(3, 16, 32), ((3, 16, 1), 2)); // Qwen3.5: 2 value heads per key head
        assert_eq!(grid(5, 8, 128), ((5, 8, 2), 8)); // Nemotron-H-8B: 16 heads per group
        assert_eq!(grid(5, 2, 18), ((5, 2, 2), 8)); // 9 per group: blocks of 8 and 1
        assert_eq!(grid(1, 1, 128), ((1, 1, 16), 8)); // one group
        assert_eq!(grid(2, 4, 4), ((2, 4, 1), 1));
    }

    /// bf16 weights on sm_80+ take the tensor-core state passes; f32 and f16 weights, and
    /// older GPUs, the f32 ones; the tensor-core kernels take key dims that are multiples of
    /// 16 up to 128.
    #[test]
    fn tensor_form_where_it_applies() {
        use WeightDtype::{Bf16, F16, F32};
        assert_eq!(Recurrence::default_for(Bf16, (9, 0)), Recurrence::Tensor);
        assert_eq!(Recurrence::default_for(Bf16, (8, 0)), Recurrence::Tensor);
        assert_eq!(Recurrence::default_for(Bf16, (7, 5)), Recurrence::Chunked);
        assert_eq!(Recurrence::default_for(F32, (9, 0)), Recurrence::Chunked);
        assert_eq!(Recurrence::default_for(F16, (9, 0)), Recurrence::Chunked);
        let fits: Vec<usize> = (0..=256).filter(|&d| Recurrence::tensor_fits(d)).collect();
        assert_eq!(fits, [16, 32, 48, 64, 80, 96, 112, 128]);
        let tensor = Recurrence::Tensor;
        let cfg = |dk| tensor.state_pass(dk, "f32", "mma", (100, 3, 2)).unwrap();
        assert_eq!((cfg(128).0, cfg(128).1.grid_dim), ("mma", (4, 3, 2)));
        assert_eq!(cfg(256).0, "f32");
        let chunked = Recurrence::Chunked
            .state_pass(128, "f32", "mma", (100, 3, 2))
            .unwrap();
        assert_eq!(chunked.0, "f32");
    }
}

#[cfg(test)]
#[path = "recurrent_chunked_tests.rs"]
mod recurrent_chunked_tests;
