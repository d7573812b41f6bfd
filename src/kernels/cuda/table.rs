//! Gather-only tables on CUDA (untied embeddings, Gemma 4's per-layer embeddings, Qwen4-Exp's
//! n-gram embeddings): uploaded whole and gathered by the embedding kernel, or — past
//! [`HOST_TABLE_BYTES`] (the release's n-gram table is ~100 GB) — left where the checkpoint
//! maps them on the host, their rows gathered there each step and uploaded (a step's rows
//! are a few MB; the GPU keeps its memory for the model).

pub use super::api::limits::HOST_TABLE_BYTES;

use super::device::CudaDevice;
use super::device_types::{CudaBuf, CudaLinear, CudaStep, invalid};
use super::ops;
use crate::kernels::Device;
use crate::kernels::device::{DevResult, HostTable, table_id_rows};

/// A gather-only table on the device or on the host.
pub enum CudaTable {
    Device(CudaLinear),
    Host(HostTable),
}

impl CudaTable {
    fn shape(&self) -> (usize, usize) {
        match self {
            Self::Device(l) => (l.w.rows, l.w.cols),
            Self::Host(t) => (t.rows, t.cols),
        }
    }
}

impl CudaDevice {
    /// `table` uploaded, or kept on the host when larger than this device's limit.
    pub(super) fn table_op(&self, table: HostTable) -> DevResult<CudaTable> {
        if table.byte_len() > self.host_tables_above {
            tracing::info!(?table, "gather-only table kept on the host");
            return Ok(CudaTable::Host(table));
        }
        Ok(CudaTable::Device(self.linear(table.matrix(), None)?))
    }

    /// [`crate::kernels::Device::embed_table`]: the step's tokens' rows times `scale`.
    pub(super) fn embed_table_op(
        &self,
        step: &CudaStep<'_>,
        table: &CudaTable,
        scale: f32,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        match table {
            CudaTable::Device(t) => self.embed(step, t, scale, out),
            CudaTable::Host(t) => self.gather_on_host(t, step.tokens, scale, (out, t.cols)),
        }
    }

    /// [`crate::kernels::Device::table_rows`]: `per_row` ids' rows side by side per row.
    pub(super) fn table_rows_op(
        &self,
        table: &CudaTable,
        ids: &[u32],
        per_row: usize,
        out: &mut CudaBuf,
    ) -> DevResult<()> {
        out.f32("table rows")?;
        let (rows, cols) = table.shape();
        if let Some(&id) = ids.iter().find(|&&i| i as usize >= rows) {
            return invalid(format!("id {id} past a table of {rows} rows"));
        }
        let n = table_id_rows(ids.len(), per_row)?;
        let table = match table {
            CudaTable::Device(t) => t,
            CudaTable::Host(t) => return self.gather_on_host(t, ids, 1.0, (out, per_row * cols)),
        };
        out.set(n, per_row * cols, "table rows")?;
        if ids.is_empty() {
            return Ok(());
        }
        let dev_ids = self.gpu.upload(ids)?;
        let (id_ptr, w) = (dev_ids.ptr(), &table.w);
        Ok(ops::embed(
            &self.gpu,
            (id_ptr, w, 1.0),
            out.ptr(),
            ids.len(),
        )?)
    }

    /// Rows `ids` of `table` widened to f32 times `scale` (rounded as the embedding kernel
    /// does), one after another, uploaded into `out` as rows of `width`.
    fn gather_on_host(
        &self,
        table: &HostTable,
        ids: &[u32],
        scale: f32,
        (out, width): (&mut CudaBuf, usize),
    ) -> DevResult<()> {
        let cols = table.cols;
        let mut rows = vec![0.0f32; ids.len() * cols];
        for (&id, row) in ids.iter().zip(rows.chunks_exact_mut(cols)) {
            table.row_into(id as usize, row).or_else(invalid)?;
            row.iter_mut().for_each(|v| *v *= scale);
        }
        out.upload(&self.gpu, &rows, width)
    }
}
