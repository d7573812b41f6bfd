//! Recurrent state slots on the device and the launchers of the recurrent kernels
//! (conv1d.cu, gated_delta.cu, mamba2.cu; their chunked forms: [`super::recurrent_chunked`]).
//!
//! State of recurrent layer `l`, slot `s`: conv `[k - 1, conv_dim]` and SSM / delta state
//! (`[nv, dk, dv]` or `[heads, head_dim, d_state]`), f32, in two buffers, each layer's
//! `[slots, per_slot]` after the previous layer's. A chunk with `start == 0` gets its slot
//! zeroed in every layer before the forward ([`StateSlots::reset_fresh`], one launch per
//! buffer when the layers share a shape), so a reused slot never leaks.

use super::context::LaunchConfig;

use super::context::{CudaError, CudaResult, DevBuf, Gpu, launch, row_tiles_cfg};
use super::ops::i32_of;
use super::recurrent_chunked::{self as chunked, DevBlocks, Recurrence};
use crate::kernels::plan::SeqState;

/// Warps per block of the warp-per-item kernels (4 × 32 = 128 threads).
const WARPS: usize = 4;
/// Grid cap of the grid-stride kernels.
const MAX_BLOCKS: usize = 65_535;

pub(super) fn u32_of(v: usize, what: &str) -> CudaResult<u32> {
    u32::try_from(v).map_err(|_| CudaError::Invalid(format!("{what} = {v} exceeds a grid")))
}

/// Grid-stride kernels: 256 threads, at most [`MAX_BLOCKS`] blocks.
fn stride_cfg(total: usize) -> CudaResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            u32_of(total.div_ceil(256).clamp(1, MAX_BLOCKS), "blocks")?,
            1,
            1,
        ),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The token-by-token scans: `cols` columns of state in blocks of [`COLS_PER_BLOCK`], per head,
/// per chunk; 128 threads.
pub(super) fn scan_cfg(
    cols: (usize, &str),
    heads: usize,
    chunks: usize,
) -> CudaResult<LaunchConfig> {
    state_cols_cfg(cols, COLS_PER_BLOCK, heads, chunks)
}

/// A pass over a request's state, parallel over heads and columns: `cols` columns in blocks
/// of `per_block`, per head, per chunk; 128 threads.
pub(super) fn state_cols_cfg(
    cols: (usize, &str),
    per_block: usize,
    heads: usize,
    chunks: usize,
) -> CudaResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (
            u32_of(cols.0.div_ceil(per_block), cols.1)?,
            u32_of(heads, "heads")?,
            u32_of(chunks, "chunks")?,
        ),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// One warp per item, [`WARPS`] warps per block.
pub fn warps_cfg(items: usize) -> CudaResult<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32_of(items.div_ceil(WARPS).max(1), "blocks")?, 1, 1),
        block_dim: ((32 * WARPS) as u32, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The chunks of one batch on the device: per token its chunk, per chunk its first row,
/// length and slot; the slots to zero (chunks starting at position 0); the blocks of the
/// chunked recurrences.
pub struct DevSeqs {
    pub num_seqs: usize,
    pub num_tokens: usize,
    tok_seq: DevBuf<i32>,
    seq_start: DevBuf<i32>,
    seq_len: DevBuf<i32>,
    seq_slot: DevBuf<i32>,
    fresh: DevBuf<i32>,
    num_fresh: usize,
    pub(super) blocks: DevBlocks,
}

impl DevSeqs {
    /// Uploads the chunks of a batch (validated by `seq_states`).
    pub fn new(gpu: &Gpu, seqs: &[SeqState], num_tokens: usize) -> CudaResult<Self> {
        let mut tok_seq = vec![0i32; num_tokens];
        let (mut start, mut len, mut slot, mut fresh) = (vec![], vec![], vec![], vec![]);
        for (i, s) in seqs.iter().enumerate() {
            if s.rows.end > num_tokens {
                return Err(CudaError::Invalid(format!(
                    "chunk rows {:?} past the batch's {num_tokens} tokens",
                    s.rows
                )));
            }
            tok_seq[s.rows.clone()].fill(i32_of(i, "chunk index")?);
            start.push(i32_of(s.rows.start, "row")?);
            len.push(i32_of(s.rows.len(), "chunk length")?);
            slot.push(i32_of(s.slot, "state slot")?);
            if s.fresh() {
                fresh.push(i32_of(s.slot, "state slot")?);
            }
        }
        Ok(Self {
            num_seqs: seqs.len(),
            num_tokens,
            tok_seq: gpu.upload(&tok_seq)?,
            seq_start: gpu.upload(&start)?,
            seq_len: gpu.upload(&len)?,
            seq_slot: gpu.upload(&slot)?,
            num_fresh: fresh.len(),
            fresh: gpu.upload(&fresh)?,
            blocks: DevBlocks::new(gpu, seqs)?,
        })
    }

    /// Device address of the chunks' state slots.
    pub(super) fn slots(&self) -> u64 {
        self.seq_slot.ptr()
    }

    /// Device addresses of the chunks' first rows, lengths and state slots.
    pub(super) fn chunks(&self) -> [u64; 3] {
        [
            self.seq_start.ptr(),
            self.seq_len.ptr(),
            self.seq_slot.ptr(),
        ]
    }
}

/// Conv and recurrent state of every recurrent layer, for `slots` requests.
pub struct StateSlots {
    conv: DevBuf<f32>,
    ssm: DevBuf<f32>,
    layers: Vec<LayerState>,
    slots: usize,
}

/// Where one layer's `[slots, per]` states start in the two buffers, and their sizes.
#[derive(Debug, Clone, Copy)]
struct LayerState {
    conv_off: usize,
    conv_per: usize,
    ssm_off: usize,
    ssm_per: usize,
}

impl StateSlots {
    /// `shapes[l]` = (conv floats, state floats) per slot of recurrent layer `l`, zero-filled.
    pub fn new(gpu: &Gpu, shapes: &[(usize, usize)], slots: usize) -> CudaResult<Self> {
        let overflow = || CudaError::Invalid("recurrent state size overflows".into());
        let (mut conv, mut ssm) = (0usize, 0usize);
        let mut layers = Vec::with_capacity(shapes.len());
        for &(conv_per, ssm_per) in shapes {
            layers.push(LayerState {
                conv_off: conv,
                conv_per,
                ssm_off: ssm,
                ssm_per,
            });
            let add = |acc: usize, per: usize| {
                slots
                    .checked_mul(per)
                    .and_then(|n| acc.checked_add(n))
                    .ok_or_else(overflow)
            };
            conv = add(conv, conv_per)?;
            ssm = add(ssm, ssm_per)?;
        }
        i32_of(slots, "state slots")?;
        Ok(Self {
            conv: gpu.zeros(conv)?,
            ssm: gpu.zeros(ssm)?,
            layers,
            slots,
        })
    }

    pub fn num_slots(&self) -> usize {
        self.slots
    }

    fn layer(&self, l: usize) -> CudaResult<LayerState> {
        self.layers.get(l).copied().ok_or_else(|| {
            CudaError::Invalid(format!("recurrent layer {l} of {}", self.layers.len()))
        })
    }

    /// (conv floats, state floats) per slot of layer `l`.
    pub fn shape(&self, l: usize) -> CudaResult<(usize, usize)> {
        let s = self.layer(l)?;
        Ok((s.conv_per, s.ssm_per))
    }

    /// Device address of layer `l`'s conv state `[slots, k - 1, conv_dim]`.
    pub fn conv(&self, l: usize) -> CudaResult<u64> {
        let s = self.layer(l)?;
        self.conv.ptr_at(s.conv_off, self.slots * s.conv_per)
    }

    /// Device address of layer `l`'s recurrent state `[slots, ...]`.
    pub fn ssm(&self, l: usize) -> CudaResult<u64> {
        let s = self.layer(l)?;
        self.ssm.ptr_at(s.ssm_off, self.slots * s.ssm_per)
    }

    /// Zeroes every layer's state of the slots of chunks that start at position 0.
    pub fn reset_fresh(&self, gpu: &Gpu, seqs: &DevSeqs) -> CudaResult<()> {
        if seqs.num_fresh == 0 {
            return Ok(());
        }
        // Consecutive layers of one shape are one `[layers, slots, per]` block (a model's
        // recurrent layers usually all share one shape): one launch per block and buffer.
        let mut first = 0;
        while first < self.layers.len() {
            let s = self.layers[first];
            let run = self.layers[first..]
                .iter()
                .take_while(|o| (o.conv_per, o.ssm_per) == (s.conv_per, s.ssm_per))
                .count();
            self.zero_run(gpu, seqs, &self.conv, (s.conv_off, s.conv_per), run)?;
            self.zero_run(gpu, seqs, &self.ssm, (s.ssm_off, s.ssm_per), run)?;
            first += run;
        }
        Ok(())
    }

    /// Copies slot `from` into slot `to` for each pair, in every layer (conv and recurrent
    /// state); the pairs are checked by the caller (`check_slot_copies`).
    pub fn copy_slots(&self, gpu: &Gpu, copies: &[(usize, usize)]) -> CudaResult<()> {
        if copies.is_empty() {
            return Ok(());
        }
        let mut pairs = Vec::with_capacity(2 * copies.len());
        for &(from, to) in copies {
            pairs.push(i32_of(from, "state slot")?);
            pairs.push(i32_of(to, "state slot")?);
        }
        let pairs = gpu.upload(&pairs)?;
        let n = i32_of(copies.len(), "slot copies")?;
        for s in &self.layers {
            for (buf, off, per) in [
                (&self.conv, s.conv_off, s.conv_per),
                (&self.ssm, s.ssm_off, s.ssm_per),
            ] {
                if per == 0 {
                    continue;
                }
                let base = buf.ptr_at(off, self.slots * per)?;
                let cfg = stride_cfg(copies.len() * per)?;
                launch!(
                    gpu,
                    "copy_state_slots_f32",
                    cfg,
                    base,
                    pairs.ptr(),
                    n,
                    per as i64
                )?;
            }
        }
        Ok(())
    }

    /// Zeroes the fresh slots of `layers` consecutive layers of `per` floats per slot from
    /// element `off` of `buf`.
    fn zero_run(
        &self,
        gpu: &Gpu,
        seqs: &DevSeqs,
        buf: &DevBuf<f32>,
        (off, per): (usize, usize),
        layers: usize,
    ) -> CudaResult<()> {
        if per == 0 || layers == 0 {
            return Ok(());
        }
        let base = buf.ptr_at(off, layers * self.slots * per)?;
        let total = layers * seqs.num_fresh * per;
        launch!(
            gpu,
            "zero_state_slots_f32",
            stride_cfg(total)?,
            base,
            seqs.fresh.ptr(),
            i32_of(seqs.num_fresh, "fresh chunks")?,
            i32_of(layers, "layers")?,
            i32_of(self.slots, "slots")?,
            per as i64
        )
    }
}

/// Where the conv input sits: column 0 of `x` (device address), rows `stride` apart.
#[derive(Debug, Clone, Copy)]
pub struct ConvIo {
    pub x: u64,
    pub stride: usize,
    /// Channels.
    pub ch: usize,
    pub k: usize,
    pub w: u64,
    /// 0 = no bias.
    pub bias: u64,
    /// This layer's conv state `[slots, k - 1, ch]`.
    pub state: u64,
    /// `[T, ch]` output.
    pub out: u64,
    /// SiLU after the conv.
    pub silu: bool,
}

/// Causal conv (+ SiLU where `c.silu`) of every token, then the slots' windows advance.
pub fn conv(gpu: &Gpu, c: ConvIo, seqs: &DevSeqs) -> CudaResult<()> {
    let t = seqs.num_tokens;
    if t == 0 {
        return Ok(());
    }
    let (stride, ch, k) = (
        i32_of(c.stride, "conv stride")?,
        i32_of(c.ch, "conv channels")?,
        i32_of(c.k, "conv kernel")?,
    );
    let ti = i32_of(t, "tokens")?;
    launch!(
        gpu,
        "conv1d_f32",
        row_tiles_cfg(t, c.ch, 256)?,
        c.x,
        stride,
        c.w,
        c.bias,
        c.state,
        seqs.tok_seq.ptr(),
        seqs.seq_start.ptr(),
        seqs.seq_slot.ptr(),
        c.out,
        ti,
        ch,
        k,
        c.silu as i32
    )?;
    if c.k < 2 {
        return Ok(());
    }
    let n = i32_of(seqs.num_seqs, "chunks")?;
    launch!(
        gpu,
        "conv1d_state_update_f32",
        stride_cfg(seqs.num_seqs * c.ch)?,
        c.x,
        stride,
        c.state,
        seqs.seq_start.ptr(),
        seqs.seq_len.ptr(),
        seqs.seq_slot.ptr(),
        n,
        ch,
        k
    )
}

/// Gated DeltaNet geometry and per-head parameters (device addresses).
#[derive(Debug, Clone, Copy)]
pub struct GdnIo {
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Conv output `[T, 2·nk·dk + nv·dv]` (q | k | v); q and k are normalised in place.
    pub qkv: u64,
    /// `b` columns (head h at +h), rows `ba_stride` apart.
    pub b: u64,
    /// `a` columns (head h at +h, or channel h·dk + i where `per_channel`), rows `a_stride`
    /// apart.
    pub a: u64,
    pub ba_stride: usize,
    pub a_stride: usize,
    pub neg_a: u64,
    pub dt_bias: u64,
    /// This layer's state `[slots, nv, dk, dv]`.
    pub state: u64,
    /// `[T, nv·dv]` f32 output.
    pub out: u64,
    /// `beta = beta_scale · sigmoid(b)`.
    pub beta_scale: f32,
    /// Kimi Delta Attention: a decay per key channel (token-serial kernel only).
    pub per_channel: bool,
}

/// Columns per block of `gated_delta_rule_f32` / rows per block of `mamba2_scan_f32`.
const COLS_PER_BLOCK: usize = 16;
/// Largest dk (GDN) / d_state (Mamba-2) the register-resident kernels hold.
pub const MAX_STATE_DIM: usize = super::limits::MAX_STATE_DIM;

/// l2norm of q and k, then the gated delta rule token by token or in blocks.
pub fn gated_delta(gpu: &Gpu, g: GdnIo, seqs: &DevSeqs, form: Recurrence) -> CudaResult<()> {
    let t = seqs.num_tokens;
    if t == 0 {
        return Ok(());
    }
    if g.dk > MAX_STATE_DIM || g.nk == 0 || !g.nv.is_multiple_of(g.nk) {
        return Err(CudaError::Invalid(format!(
            "Gated DeltaNet nk {} nv {} dk {} (dk <= {MAX_STATE_DIM}, nv a multiple of nk)",
            g.nk, g.nv, g.dk
        )));
    }
    let key_dim = g.nk * g.dk;
    let stride = i32_of(2 * key_dim + g.nv * g.dv, "qkv width")?;
    let (ti, nk, nv) = (
        i32_of(t, "tokens")?,
        i32_of(g.nk, "nk")?,
        i32_of(g.nv, "nv")?,
    );
    let (dk, dv) = (i32_of(g.dk, "dk")?, i32_of(g.dv, "dv")?);
    // As the CPU: 1 / sqrt(dk) in f32.
    let scale = 1.0f32 / (g.dk as f32).sqrt();
    launch!(
        gpu,
        "gdn_qk_l2norm_f32",
        warps_cfg(t * 2 * g.nk)?,
        g.qkv,
        stride,
        ti,
        nk,
        dk,
        scale
    )?;
    // The chunked forms take one decay per head, and b and a rows of one stride.
    if form != Recurrence::Serial && !g.per_channel && g.a_stride == g.ba_stride {
        return chunked::gated_delta(gpu, &g, seqs, stride, form);
    }
    // Kimi Delta Attention: each token's decays per key channel, once (the serial kernel
    // reads them in place of `a`).
    let decay: DevBuf<f32>;
    let (a, a_stride) = match g.per_channel {
        true => {
            let width = g.nv * g.dk;
            decay = gpu.zeros(t * width)?;
            launch!(
                gpu,
                "kda_decay_f32",
                stride_cfg(t * width)?,
                g.a,
                i32_of(g.a_stride, "a stride")?,
                g.neg_a,
                g.dt_bias,
                decay.ptr(),
                ti,
                nv,
                dk
            )?;
            (decay.ptr(), width)
        }
        false => (g.a, g.a_stride),
    };
    launch!(
        gpu,
        "gated_delta_rule_f32",
        scan_cfg((g.dv, "dv blocks"), g.nv, seqs.num_seqs)?,
        g.qkv,
        stride,
        g.b,
        a,
        i32_of(g.ba_stride, "b/a stride")?,
        g.neg_a,
        g.dt_bias,
        g.state,
        seqs.seq_start.ptr(),
        seqs.seq_len.ptr(),
        seqs.seq_slot.ptr(),
        g.out,
        nk,
        nv,
        dk,
        dv,
        g.beta_scale,
        i32_of(a_stride, "a stride")?,
        i32::from(g.per_channel)
    )
}

/// Mamba-2 geometry and per-head parameters (device addresses).
#[derive(Debug, Clone, Copy)]
pub struct MambaIo {
    pub heads: usize,
    pub head_dim: usize,
    pub d_state: usize,
    pub groups: usize,
    /// Conv output `[T, heads·head_dim + 2·groups·d_state]` (x | B | C).
    pub xbc: u64,
    /// Raw dt column 0 (head h at +h), rows `dt_stride` apart.
    pub dt: u64,
    pub dt_stride: usize,
    pub neg_a: u64,
    pub d: u64,
    pub dt_bias: u64,
    pub dt_min: f32,
    /// This layer's state `[slots, heads, head_dim, d_state]`.
    pub state: u64,
    /// `[T, heads·head_dim]` f32 output.
    pub y: u64,
}

/// The Mamba-2 selective scan, token by token or in blocks.
pub fn mamba2_scan(gpu: &Gpu, m: MambaIo, seqs: &DevSeqs, form: Recurrence) -> CudaResult<()> {
    if seqs.num_tokens == 0 {
        return Ok(());
    }
    if m.d_state > MAX_STATE_DIM || m.groups == 0 || !m.heads.is_multiple_of(m.groups) {
        return Err(CudaError::Invalid(format!(
            "Mamba-2 heads {} groups {} d_state {} (d_state <= {MAX_STATE_DIM})",
            m.heads, m.groups, m.d_state
        )));
    }
    let inner = m.heads * m.head_dim;
    let stride = i32_of(inner + 2 * m.groups * m.d_state, "xBC width")?;
    if form != Recurrence::Serial {
        return chunked::mamba2_scan(gpu, &m, seqs, stride, form);
    }
    launch!(
        gpu,
        "mamba2_scan_f32",
        scan_cfg((m.head_dim, "head_dim blocks"), m.heads, seqs.num_seqs)?,
        m.xbc,
        stride,
        m.dt,
        i32_of(m.dt_stride, "dt stride")?,
        m.neg_a,
        m.d,
        m.dt_bias,
        m.dt_min,
        m.state,
        seqs.seq_start.ptr(),
        seqs.seq_len.ptr(),
        seqs.seq_slot.ptr(),
        m.y,
        i32_of(m.heads, "heads")?,
        i32_of(m.head_dim, "head_dim")?,
        i32_of(m.d_state, "d_state")?,
        i32_of(m.groups, "groups")?
    )
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::super::context::kernel_names_for_test;
    use super::super::nvrtc::SOURCES;

    /// Every kernel the recurrent launchers call is an entry point of a loaded source.
    #[test]
    fn launched_recurrent_kernels_exist() {
        let all: Vec<String> = SOURCES
            .iter()
            .flat_map(|(_, src)| kernel_names_for_test(src))
            .collect();
        let mut wanted: Vec<String> = [
            "zero_state_slots_f32",
            "copy_state_slots_f32",
            "conv1d_f32",
            "conv1d_state_update_f32",
            "gdn_qk_l2norm_f32",
            "gated_delta_rule_f32",
            "kda_decay_f32",
            "mamba1_scan_f32",
            "mamba2_scan_f32",
            "gdn_chunk_prep_f32",
            "gdn_chunk_state_f32",
            "gdn_chunk_out_f32",
            "mamba2_chunk_prep_f32",
            "mamba2_chunk_state_f32",
            "mamba2_chunk_out_f32",
        ]
        .map(String::from)
        .to_vec();
        for d in ["f32", "bf16", "f16"] {
            for k in [
                "gdn_gated_norm",
                "gdn_sigmoid_norm",
                "mamba2_gated_norm",
                "relu2",
            ] {
                wanted.push(format!("{k}_{d}"));
            }
        }
        for w in &wanted {
            assert!(all.contains(w), "kernel `{w}` is launched but not defined");
        }
    }
}
