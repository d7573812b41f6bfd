//! Paged KV cache (per layer, `num_blocks × block_size` slots for K and for V), f32.

use crate::kernels::device::KvShape;

/// K and V of every layer: `[num_blocks * block_size, kv_dim]` each, f32.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    num_blocks: usize,
    block_size: usize,
    kv_dim: usize,
}

impl KvCache {
    /// Allocates the cache, zeroed; an error, not an abort, when memory is short.
    pub fn new(
        layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_dim: usize,
    ) -> Result<Self, String> {
        let shape = KvShape {
            layers,
            num_blocks,
            block_size,
            kv_dim,
            index: None,
        };
        let per_layer = shape.per_layer().ok_or("KV cache size overflows")?;
        // Zeroed by the allocator (calloc: fresh pages from the OS are zero and only become
        // resident when a block is first written), not by a memset over every block: that
        // pass faulted in the whole cache at load, ~9% of a short bf16 run.
        let (k, v) = shape.alloc_layers(|| {
            bytemuck::allocation::try_zeroed_vec::<f32>(per_layer).map_err(|()| {
                format!(
                    "cannot allocate a KV cache layer of {} bytes",
                    per_layer * 4
                )
            })
        })?;
        Ok(Self {
            k,
            v,
            num_blocks,
            block_size,
            kv_dim,
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Writes rows `k[t]`, `v[t]` (`[T, kv_dim]`) into `slots[t]` of `layer`.
    pub fn write(&mut self, layer: usize, slots: &[usize], k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let (kc, vc) = (&mut self.k[layer], &mut self.v[layer]);
        for (t, &slot) in slots.iter().enumerate() {
            kc[slot * d..(slot + 1) * d].copy_from_slice(&k[t * d..(t + 1) * d]);
            vc[slot * d..(slot + 1) * d].copy_from_slice(&v[t * d..(t + 1) * d]);
        }
    }

    /// `(K, V)` of one layer.
    pub fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        (&self.k[layer], &self.v[layer])
    }
}
