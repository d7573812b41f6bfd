//! [`HostTable`]: an embedding table that is only ever gathered from, kept where the checkpoint
//! maps it (Gemma 4 E2B / E4B's per-layer table: 262,144 × 35 × 256 values, 4.7 GB in bf16).
//! A device that reads rows on the host gathers straight from the mapped file: only the pages
//! around the rows of the tokens seen are read, nothing is copied into the process's own
//! memory, and the kernel may drop them again under memory pressure (clean, file-backed); one
//! that cannot uploads it whole.

use std::ops::Range;
use std::sync::Arc;

use super::HostMatrix;
use crate::kernels::dtype::{WeightDtype, dtype_size, widen_into};

/// Bytes shared with whoever else holds them: a mapped checkpoint file, or owned bytes.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A `[rows, cols]` table of little-endian `dtype` elements at `range` of `bytes`.
#[derive(Clone)]
pub struct HostTable {
    bytes: SharedBytes,
    range: Range<usize>,
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostTable [{}, {}] {:?}",
            self.rows, self.cols, self.dtype
        )
    }
}

impl HostTable {
    /// The table at `range` of `bytes`; an error unless the range lies in the bytes and holds
    /// exactly `rows · cols` elements.
    pub fn new(
        bytes: SharedBytes,
        range: Range<usize>,
        dtype: WeightDtype,
        (rows, cols): (usize, usize),
    ) -> Result<Self, String> {
        let need = (rows.checked_mul(cols)).and_then(|n| n.checked_mul(dtype_size(dtype)));
        let have = (*bytes).as_ref().get(range.clone()).map(<[u8]>::len);
        match (need, have) {
            (Some(n), Some(h)) if n == h => Ok(Self {
                bytes,
                range,
                dtype,
                rows,
                cols,
            }),
            _ => Err(format!(
                "a [{rows}, {cols}] {dtype:?} table in {have:?} bytes (range {range:?})"
            )),
        }
    }

    /// Owned values (a table made on the host: tests, conversions).
    pub fn from_matrix(m: &HostMatrix<'_>) -> Self {
        let bytes: SharedBytes = Arc::new(m.data.to_vec());
        let len = m.data.len();
        Self::new(bytes, 0..len, m.dtype, (m.rows, m.cols)).expect("a matrix's own bytes")
    }

    fn data(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.range.clone()]
    }

    /// The whole table as a matrix borrowing its bytes (for a device that uploads it).
    pub fn matrix(&self) -> HostMatrix<'_> {
        HostMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data: std::borrow::Cow::Borrowed(self.data()),
        }
    }

    /// Row `r` widened to f32 into `out` (`cols` values); an error for a row past the table.
    pub fn row_into(&self, r: usize, out: &mut [f32]) -> Result<(), String> {
        if r >= self.rows || out.len() != self.cols {
            return Err(format!(
                "row {r} of a [{}, {}] table into {} values",
                self.rows,
                self.cols,
                out.len()
            ));
        }
        let size = self.cols * dtype_size(self.dtype);
        widen_into(&self.data()[r * size..(r + 1) * size], self.dtype, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dtype::narrow_into;

    /// Rows widen exactly from every dtype, at an offset into shared bytes; bad ranges, sizes
    /// and rows are errors.
    #[test]
    fn rows_widen_from_shared_bytes() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        for dtype in [WeightDtype::F32, WeightDtype::Bf16, WeightDtype::F16] {
            let size = dtype_size(dtype);
            let mut bytes = vec![0xAAu8; 3 + values.len() * size];
            narrow_into(&values, dtype, &mut bytes[3..]);
            let len = bytes.len();
            let shared: SharedBytes = Arc::new(bytes);
            let t = HostTable::new(shared.clone(), 3..len, dtype, (4, 3)).unwrap();
            let mut row = vec![0.0; 3];
            t.row_into(2, &mut row).unwrap();
            assert_eq!(row, values[6..9], "{dtype:?}");
            assert!(t.row_into(4, &mut row).is_err(), "{dtype:?}");
            assert!(t.row_into(0, &mut [0.0; 2]).is_err(), "{dtype:?}");
            assert!(HostTable::new(shared.clone(), 2..len, dtype, (4, 3)).is_err());
            assert!(HostTable::new(shared.clone(), 3..len + 1, dtype, (4, 3)).is_err());
            assert!(HostTable::new(shared, 3..len, dtype, (usize::MAX, 3)).is_err());
            assert_eq!(t.matrix().to_f32(), values, "{dtype:?}");
        }
    }
}
