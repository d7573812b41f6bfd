//! [`ModelBackend`]: any architecture on any [`Device`] as the model runner's
//! [`Backend`]: the model, its KV cache and state slots, the activation buffers and the
//! capture staging, made once at load.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use super::decoder::{CacheShape, Decoder, Scratch};
use super::layers::{Ctx, Loader};
use super::{ModelError, ModelSpec, Weights, registry};
use crate::kernels::device::{CaptureSpec, DevResult, KvShape};
use crate::kernels::plan::{BatchPlan, PlanLimits, SeqState, seq_states};
use crate::kernels::{Backend, BackendError, BadRow, Batch, BatchOutput, Device, OutputDtype};

/// How to lay a model out on a device, whatever the device.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Layer ids to capture, ascending, each in `0..=L` (DESIGN.md §1.1).
    pub capture_layers: Vec<usize>,
    /// KV cache blocks per layer.
    pub num_blocks: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Recurrent-state slots (one per running request; ignored for models without recurrent
    /// layers).
    pub num_state_slots: usize,
    /// Most tokens of one forward: buffers are made for it (`None`: the device grows them).
    pub max_tokens: Option<usize>,
    /// dtype of the captured rows handed to the connector.
    pub output_dtype: OutputDtype,
    /// Refuse captured rows with NaN / Inf, or all zeros at a layer id >= 1.
    pub reject_bad_states: bool,
}

/// A model, its caches and buffers on device `D` (field order = drop order: everything on
/// the device before the device).
pub struct ModelBackend<D: Device> {
    model: Decoder<D>,
    scratch: Scratch<D>,
    kv: D::Kv,
    states: Option<D::States>,
    capture: D::Capture,
    layout: Layout,
    /// layer id -> capture slot
    capture_slot: Vec<Option<usize>>,
    dev: D,
}

impl<D: Device> ModelBackend<D> {
    /// Loads the model of `dir` (described by `spec`) onto `dev`.
    pub fn new(dev: D, dir: &Path, spec: ModelSpec, layout: Layout) -> Result<Self, ModelError> {
        check_layout(&spec, &layout)?;
        let weights = Weights::open(dir)?
            .renamed(spec.architecture.released_renames())
            .dequantizing((spec.fp8, spec.compressed), spec.dtype);
        let model = dev.run(|| {
            let ld = Loader {
                dev: &dev,
                w: &weights,
            };
            registry::load(&ld, spec)
        })?;
        let shape = model.cache_shape();
        let kv = dev.kv_cache(KvShape {
            layers: shape.kv_layers,
            num_blocks: layout.num_blocks,
            block_size: layout.block_size,
            kv_dim: shape.kv_dim,
            index: shape.index,
        })?;
        let states = match shape.state_shapes.is_empty() {
            true => None,
            false => Some(dev.state_cache(&shape.state_shapes, layout.num_state_slots)?),
        };
        let t = layout.max_tokens.unwrap_or(0);
        let scratch = model.scratch(&dev, t)?;
        let (k, h) = (layout.capture_layers.len(), model.spec.stream_width());
        let guard = (layout.reject_bad_states)
            .then(|| layout.capture_layers.iter().map(|&id| id >= 1).collect());
        let capture = dev.capture_buffer(CaptureSpec {
            layers: k,
            hidden: h,
            rows: t,
            dtype: layout.output_dtype,
            guard,
        })?;
        let capture_slot = capture_slots(&layout.capture_layers, model.spec.num_layers);
        tracing::debug!(device = %dev.describe(), arch = model.spec.architecture.hf_name(), "model loaded");
        Ok(Self {
            model,
            scratch,
            kv,
            states,
            capture,
            layout,
            capture_slot,
            dev,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.model.spec
    }

    pub fn device(&self) -> &D {
        &self.dev
    }

    pub fn cache_shape(&self) -> CacheShape {
        self.model.cache_shape()
    }

    /// The model's final RMSNorm over `hidden`-wide rows: turns captured id-L rows into Hugging
    /// Face's post-norm `hidden_states[L]`.
    pub fn final_norm(&self, rows: &[f32]) -> Result<Vec<f32>, BackendError> {
        let (dev, model) = (&self.dev, &self.model);
        Ok(dev.run(|| model.final_norm(dev, rows))?)
    }

    fn run(
        &mut self,
        batch: &Batch<'_>,
        plan: &BatchPlan<'_>,
        seqs: &[SeqState],
    ) -> DevResult<BatchOutput> {
        let Self {
            model,
            scratch,
            kv,
            states,
            capture,
            capture_slot,
            dev,
            layout,
        } = self;
        let dev: &D = dev;
        dev.run(|| {
            let step = dev.begin(batch.token_ids, plan, seqs, states.as_mut())?;
            let mut ctx = Ctx {
                batch,
                step: &step,
                kv,
                states: states.as_mut(),
            };
            dev.capture_begin(capture)?;
            let mut cap = |id: usize, x: &D::Buf| match capture_slot.get(id).copied().flatten() {
                Some(k) => dev.capture(capture, k, x),
                None => Ok(()),
            };
            model.forward(dev, &mut ctx, scratch, &mut cap)?;
            let rows: Vec<usize> = plan.sample_rows.iter().map(|&(_, r)| r).collect();
            let tokens = model.greedy(dev, &scratch.x, &rows)?;
            let captured = dev.capture_finish(capture, plan.num_tokens())?;
            let bad_rows = (captured.refused.iter())
                .map(|&(row, slot, fault)| BadRow {
                    row,
                    layer: layout.capture_layers[slot],
                    fault,
                })
                .collect();
            Ok(BatchOutput {
                captured: captured.bytes,
                dtype: layout.output_dtype,
                sampled: plan.sampled(tokens, batch.seqs.len()),
                bad_rows,
            })
        })
    }
}

impl<D: Device> Backend for ModelBackend<D> {
    fn hidden_size(&self) -> usize {
        self.model.spec.stream_width()
    }

    fn capture_layers(&self) -> &[usize] {
        &self.layout.capture_layers
    }

    fn output_dtype(&self) -> OutputDtype {
        self.layout.output_dtype
    }

    fn device_name(&self) -> String {
        self.device().describe()
    }

    fn state_slot_bytes(&self) -> usize {
        let shapes = self.model.cache_shape().state_shapes;
        shapes.iter().map(|&(c, s)| (c + s) * 4).sum()
    }

    fn add_snapshot_slots(&mut self, n: usize) -> Result<usize, BackendError> {
        let first = self.layout.num_state_slots;
        if n == 0 || self.states.is_none() {
            return Ok(first);
        }
        let shapes = self.model.cache_shape().state_shapes;
        // The running requests' slots stay `0..first` (`seq_states` checks chunks against
        // them); the new cache is zero-filled, as nothing has run yet.
        self.states = None;
        let states = self.dev.state_cache(&shapes, first + n)?;
        self.states = Some(states);
        Ok(first)
    }

    fn copy_state_slots(&mut self, copies: &[(usize, usize)]) -> Result<(), BackendError> {
        let Some(states) = self.states.as_mut() else {
            return match copies {
                [] => Ok(()),
                _ => Err(BackendError::InvalidBatch(
                    "no recurrent state to copy".into(),
                )),
            };
        };
        let dev = &self.dev;
        Ok(dev.run(|| dev.copy_state_slots(states, copies))?)
    }

    fn recycle_captured(&mut self, bytes: Vec<u8>) {
        self.dev.capture_recycle(&mut self.capture, bytes);
    }

    fn forward(&mut self, batch: &Batch<'_>) -> Result<BatchOutput, BackendError> {
        let spec = &self.model.spec;
        let limits = PlanLimits::new(
            spec.vocab_size,
            spec.max_position_embeddings,
            self.layout.num_blocks,
            self.layout.block_size,
        );
        let plan = BatchPlan::new(batch, &limits)?;
        let seqs = match &self.states {
            Some(_) => seq_states(batch, self.layout.num_state_slots)?,
            None => Vec::new(),
        };
        let t = plan.num_tokens();
        if t == 0 {
            return Ok(BatchOutput::empty(batch, self.layout.output_dtype));
        }
        if let Some(max) = self.layout.max_tokens.filter(|&m| t > m) {
            return Err(BackendError::InvalidBatch(format!(
                "{t} tokens exceed the device's token budget {max}"
            )));
        }
        match catch_unwind(AssertUnwindSafe(|| self.run(batch, &plan, &seqs))) {
            Ok(out) => Ok(out?),
            Err(panic) => Err(BackendError::Compute(format!(
                "forward panicked: {}",
                panic_message(panic.as_ref())
            ))),
        }
    }
}

fn check_layout(spec: &ModelSpec, l: &Layout) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    if l.block_size == 0 || l.num_blocks == 0 || l.max_tokens == Some(0) {
        return bad(format!(
            "num_blocks ({}), block_size ({}) and the token budget ({:?}) must be > 0",
            l.num_blocks, l.block_size, l.max_tokens
        ));
    }
    if l.num_blocks > u32::MAX as usize {
        return bad(format!(
            "num_blocks {} does not fit block ids (u32)",
            l.num_blocks
        ));
    }
    if spec.has_recurrent_layers() && l.num_state_slots == 0 {
        return bad(format!(
            "{} has recurrent layers and needs num_state_slots > 0 (one per running request)",
            spec.architecture.hf_name()
        ));
    }
    check_capture_layers(spec, &l.capture_layers)
}

/// Capture layer ids are in `0..=L` and strictly ascending.
fn check_capture_layers(spec: &ModelSpec, layers: &[usize]) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidOptions(m));
    let l = spec.num_layers;
    if let Some(&id) = layers.iter().find(|&&id| id > l) {
        return bad(format!("capture layer {id} is out of range 0..={l}"));
    }
    if layers.windows(2).any(|w| w[0] >= w[1]) {
        return bad(format!(
            "capture layers {layers:?} must be strictly ascending"
        ));
    }
    Ok(())
}

/// Layer id (`0..=num_layers`) -> index of that id in `capture_layers` (checked ids).
fn capture_slots(capture_layers: &[usize], num_layers: usize) -> Vec<Option<usize>> {
    let mut slots = vec![None; num_layers + 1];
    for (k, &id) in capture_layers.iter().enumerate() {
        slots[id] = Some(k);
    }
    slots
}

/// The message of a caught panic.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}
