//! The devices a model can be put on, with their options: [`CpuBackend`] and
//! [`load_cuda`] (the only place that names a concrete device).

use std::path::Path;

use super::backend::{Layout, ModelBackend};
use super::{ModelError, ModelSpec};
use crate::kernels::CpuDevice;
use crate::kernels::{Backend, Bf16Kernel, OutputDtype};

/// A model on the CPU.
pub type CpuBackend = ModelBackend<CpuDevice>;

/// How to build a [`CpuBackend`].
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// Layer ids to capture, ascending, each in `0..=L` (DESIGN.md §1.1).
    pub capture_layers: Vec<usize>,
    /// KV cache blocks per layer.
    pub num_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Threads of the backend's rayon pool; 0 = all cores.
    pub threads: usize,
    /// Recurrent-state slots (hybrid models: one per running request, i.e. `max_num_seqs`;
    /// ignored for dense models).
    pub num_state_slots: usize,
    /// dtype of the captured rows.
    pub output_dtype: OutputDtype,
    /// Refuse captured rows with NaN / Inf, or all zeros at a layer id >= 1.
    pub reject_bad_states: bool,
    /// How bf16 weights are multiplied (`[model] cpu_bf16_kernel`).
    pub bf16_kernel: Bf16Kernel,
}

impl ModelBackend<CpuDevice> {
    /// Loads the weights of `dir` for `spec` (from [`ModelSpec::from_dir`]) onto the CPU.
    pub fn load(dir: &Path, spec: ModelSpec, opts: CpuOptions) -> Result<Self, ModelError> {
        let dev =
            CpuDevice::new(opts.threads, opts.bf16_kernel).map_err(ModelError::InvalidOptions)?;
        let layout = Layout {
            capture_layers: opts.capture_layers,
            num_blocks: opts.num_blocks,
            block_size: opts.block_size,
            num_state_slots: opts.num_state_slots,
            max_tokens: None,
            output_dtype: opts.output_dtype,
            reject_bad_states: opts.reject_bad_states,
        };
        ModelBackend::new(dev, dir, spec, layout)
    }

    /// Threads of the backend's pool.
    pub fn threads(&self) -> usize {
        self.device().threads()
    }
}

/// How to build a model on a CUDA device.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    pub capture_layers: Vec<usize>,
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_state_slots: usize,
    /// Most tokens of one forward (`engine.max_num_batched_tokens`): activation and capture
    /// staging buffers are allocated once for it.
    pub max_num_batched_tokens: usize,
    /// CUDA device ordinal.
    pub device: usize,
    pub output_dtype: OutputDtype,
    pub reject_bad_states: bool,
    /// Gather-only tables larger than this stay on the host
    /// (`kernels::cuda::limits::HOST_TABLE_BYTES` in the engine).
    pub host_tables_above: usize,
}

/// Why `spec` cannot run on the CUDA kernels (`None`: it can).
pub fn cuda_unsupported(spec: &ModelSpec) -> Option<String> {
    use crate::kernels::cuda::limits;
    let attn = spec
        .hybrid
        .as_ref()
        .is_none_or(|h| h.layers.iter().any(|k| k.has_attention()));
    if attn && spec.head_dim > limits::ATTN_MAX_HEAD_DIM {
        return Some(format!(
            "head_dim {} > {}",
            spec.head_dim,
            limits::ATTN_MAX_HEAD_DIM
        ));
    }
    // Gemma 4's full layers (the releases' global_head_dim 512).
    if let Some(d) = (spec.gemma4.as_ref())
        .map(|g| g.max_head_dim())
        .filter(|&d| d > limits::ATTN_MAX_HEAD_DIM)
    {
        return Some(format!(
            "its full layers' head_dim {d} > {} (the CUDA attention kernels' largest)",
            limits::ATTN_MAX_HEAD_DIM
        ));
    }
    let h = spec.hybrid.as_ref()?;
    if let Some(g) = h
        .gdn
        .as_ref()
        .filter(|g| g.k_head_dim > limits::MAX_STATE_DIM)
    {
        return Some(format!(
            "linear_key_head_dim {} > {}",
            g.k_head_dim,
            limits::MAX_STATE_DIM
        ));
    }
    if let Some(m) = h
        .mamba
        .as_ref()
        .filter(|m| m.state_size > limits::MAX_STATE_DIM)
    {
        return Some(format!(
            "ssm_state_size {} > {}",
            m.state_size,
            limits::MAX_STATE_DIM
        ));
    }
    if let Some(m) = h
        .moe
        .as_ref()
        .filter(|m| m.num_experts > limits::MAX_EXPERTS)
    {
        return Some(format!(
            "num_experts {} > {}",
            m.num_experts,
            limits::MAX_EXPERTS
        ));
    }
    if let Some(g) = h
        .moe
        .as_ref()
        .and_then(|m| m.grouped())
        .filter(|g| g.n_group > limits::MAX_EXPERT_GROUPS)
    {
        return Some(format!(
            "n_group {} > {}",
            g.n_group,
            limits::MAX_EXPERT_GROUPS
        ));
    }
    if let Some(m) = h.nemotron_moe.as_ref().filter(|m| {
        m.num_experts > limits::MAX_EXPERTS || m.router.n_group > limits::MAX_EXPERT_GROUPS
    }) {
        return Some(format!(
            "n_routed_experts {} in n_group {} (at most {} in {})",
            m.num_experts,
            m.router.n_group,
            limits::MAX_EXPERTS,
            limits::MAX_EXPERT_GROUPS
        ));
    }
    None
}

/// Whether `spec` runs on a CUDA device (in a build with the `cuda` feature).
pub fn cuda_supports(spec: &ModelSpec) -> bool {
    cfg!(any(feature = "cuda", feature = "cuda-emu")) && cuda_unsupported(spec).is_none()
}

/// Loads the model of `dir` onto CUDA device `opts.device`.
pub fn load_cuda(
    dir: &Path,
    spec: ModelSpec,
    opts: CudaOptions,
) -> Result<Box<dyn Backend>, ModelError> {
    if let Some(why) = cuda_unsupported(&spec) {
        return Err(ModelError::InvalidOptions(format!(
            "{} does not run on the CUDA backend: {why} (use device = \"cpu\")",
            spec.architecture.hf_name()
        )));
    }
    let layout = Layout {
        capture_layers: opts.capture_layers,
        num_blocks: opts.num_blocks,
        block_size: opts.block_size,
        num_state_slots: opts.num_state_slots,
        max_tokens: Some(opts.max_num_batched_tokens),
        output_dtype: opts.output_dtype,
        reject_bad_states: opts.reject_bad_states,
    };
    cuda_backend(dir, spec, (opts.device, opts.host_tables_above), layout)
}

#[cfg(any(feature = "cuda", feature = "cuda-emu"))]
fn cuda_backend(
    dir: &Path,
    spec: ModelSpec,
    (ordinal, host_tables_above): (usize, usize),
    layout: Layout,
) -> Result<Box<dyn Backend>, ModelError> {
    let dev = crate::kernels::cuda::CudaDevice::new(ordinal, spec.dtype)
        .map_err(|e| ModelError::InvalidOptions(format!("cuda: {e}")))?
        .with_host_tables_above(host_tables_above);
    Ok(Box::new(ModelBackend::new(dev, dir, spec, layout)?))
}

#[cfg(not(any(feature = "cuda", feature = "cuda-emu")))]
fn cuda_backend(
    _dir: &Path,
    _spec: ModelSpec,
    _device: (usize, usize),
    _layout: Layout,
) -> Result<Box<dyn Backend>, ModelError> {
    Err(ModelError::InvalidOptions(
        crate::kernels::cuda::CudaUnavailable::NotBuilt.to_string(),
    ))
}
