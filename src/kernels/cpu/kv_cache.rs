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
    /// Allocates (and zero-fills) the cache; an error, not an abort, when memory is short.
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
        };
        let per_layer = shape.per_layer().ok_or("KV cache size overflows")?;
        let (k, v) = shape.alloc_layers(|| -> Result<Vec<f32>, String> {
            let mut v = Vec::new();
            v.try_reserve_exact(per_layer).map_err(|e| {
                format!(
                    "cannot allocate a KV cache layer of {} bytes: {e}",
                    per_layer * 4
                )
            })?;
            v.resize(per_layer, 0.0);
            Ok(v)
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
