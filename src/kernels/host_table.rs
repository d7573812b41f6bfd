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
    /// The row ranges in order: a table a checkpoint stores in pieces (Qwen4-Exp's n-gram
    /// table, `shard_*`) is their rows one after another.
    parts: Vec<TablePart>,
    pub dtype: WeightDtype,
    pub rows: usize,
    pub cols: usize,
}

/// Rows `first..first + rows` of a table, in `bytes[range]`.
#[derive(Clone)]
struct TablePart {
    bytes: SharedBytes,
    range: Range<usize>,
    first: usize,
}

impl std::fmt::Debug for HostTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostTable [{}, {}] {:?} in {} part(s)",
            self.rows,
            self.cols,
            self.dtype,
            self.parts.len()
        )
    }
}

impl HostTable {
    /// The `[rows, cols]` table of `dtype` in `bytes[range]` (which must hold exactly it).
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
                parts: vec![TablePart {
                    bytes,
                    range,
                    first: 0,
                }],
                dtype,
                rows,
                cols,
            }),
            _ => Err(format!(
                "a [{rows}, {cols}] {dtype:?} table in {have:?} bytes (range {range:?})"
            )),
        }
    }

    /// The tables' rows one after another (all of one dtype and width).
    pub fn concat(tables: Vec<HostTable>) -> Result<Self, String> {
        let first = tables.first().ok_or("a table of no parts")?;
        let (dtype, cols) = (first.dtype, first.cols);
        let mut parts = Vec::new();
        let mut rows = 0usize;
        for t in tables {
            if (t.dtype, t.cols) != (dtype, cols) {
                let (d, c) = (t.dtype, t.cols);
                return Err(format!(
                    "a {d:?} part of {c} columns in a {dtype:?} table of {cols}"
                ));
            }
            for p in t.parts {
                parts.push(TablePart {
                    first: rows + p.first,
                    ..p
                });
            }
            rows += t.rows;
        }
        Ok(Self {
            parts,
            dtype,
            rows,
            cols,
        })
    }

    /// A table holding a copy of `m`'s bytes.
    pub fn from_matrix(m: &HostMatrix<'_>) -> Self {
        let bytes: SharedBytes = Arc::new(m.data.to_vec());
        let len = m.data.len();
        Self::new(bytes, 0..len, m.dtype, (m.rows, m.cols)).expect("a matrix's own bytes")
    }

    fn data(part: &TablePart) -> &[u8] {
        &(*part.bytes).as_ref()[part.range.clone()]
    }

    /// The whole table as a matrix (borrowed where it is one part, else copied): for a device
    /// that uploads it.
    pub fn matrix(&self) -> HostMatrix<'_> {
        let data = match self.parts.as_slice() {
            [one] => std::borrow::Cow::Borrowed(Self::data(one)),
            parts => std::borrow::Cow::Owned(parts.iter().flat_map(Self::data).copied().collect()),
        };
        HostMatrix {
            dtype: self.dtype,
            rows: self.rows,
            cols: self.cols,
            data,
        }
    }

    /// The table's size in bytes.
    pub fn byte_len(&self) -> usize {
        self.rows * self.cols * dtype_size(self.dtype)
    }

    /// Row `r` widened to f32 into `out` (`cols` values).
    pub fn row_into(&self, r: usize, out: &mut [f32]) -> Result<(), String> {
        if r >= self.rows || out.len() != self.cols {
            return Err(format!(
                "row {r} of a [{}, {}] table into {} values",
                self.rows,
                self.cols,
                out.len()
            ));
        }
        let part = &self.parts[self.parts.partition_point(|p| p.first <= r) - 1];
        let size = self.cols * dtype_size(self.dtype);
        let at = (r - part.first) * size;
        widen_into(&Self::data(part)[at..at + size], self.dtype, out);
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

    /// A table in pieces (of 1, 2 and 3 rows) reads and uploads as the whole one; pieces of
    /// another dtype or width are refused.
    #[test]
    fn parts_read_as_one_table() {
        let values: Vec<f32> = (0..18).map(|i| i as f32 - 7.0).collect();
        let part = |rows: std::ops::Range<usize>| {
            let bytes: Vec<u8> = values[rows.start * 3..rows.end * 3]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            let len = bytes.len();
            HostTable::new(Arc::new(bytes), 0..len, WeightDtype::F32, (rows.len(), 3)).unwrap()
        };
        let t = HostTable::concat(vec![part(0..1), part(1..3), part(3..6)]).unwrap();
        assert_eq!(t.rows, 6);
        let mut row = [0.0; 3];
        for r in 0..6 {
            t.row_into(r, &mut row).unwrap();
            assert_eq!(row, values[r * 3..r * 3 + 3], "row {r}");
        }
        assert!(t.row_into(6, &mut row).is_err());
        assert_eq!(t.matrix().to_f32(), values);
        let nested = HostTable::concat(vec![t, part(0..2)]).unwrap();
        nested.row_into(7, &mut row).unwrap();
        assert_eq!(row, values[3..6]);
        let mut narrow = vec![0u8; 8];
        narrow_into(&[1.0, 2.0, 3.0, 4.0], WeightDtype::Bf16, &mut narrow);
        let bf16 = HostTable::new(Arc::new(narrow), 0..8, WeightDtype::Bf16, (1, 4)).unwrap();
        assert!(HostTable::concat(vec![part(0..1), bf16]).is_err());
        assert!(HostTable::concat(Vec::new()).is_err());
    }
}
