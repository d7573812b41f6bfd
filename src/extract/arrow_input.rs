//! Hugging Face `datasets` directories saved with `save_to_disk`: `state.json` lists the Arrow
//! IPC stream files in order; rows are numbered across them. Column `input_ids` (a list of
//! integers) is what hsx reads; `loss_mask` and others stay in the dataset (speculators joins
//! them by row index).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, UInt32Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_ipc::reader::StreamReader;
use serde::Deserialize;

#[derive(Deserialize)]
struct State {
    #[serde(rename = "_data_files")]
    data_files: Vec<DataFile>,
}

#[derive(Deserialize)]
struct DataFile {
    filename: String,
}

/// `--shard i/N`: machine i of N takes a contiguous slice of the rows (speculators'
/// `--world-size/--rank` split: the remainder goes to the first shards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid shard {s:?}: expected i/N with 0 <= i < N");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }

    /// The rows `start..end` of `total` this shard takes.
    pub fn range(&self, total: usize) -> std::ops::Range<usize> {
        let (base, extra) = (total / self.count, total % self.count);
        let start = self.index * base + self.index.min(extra);
        let len = base + usize::from(self.index < extra);
        start..start + len
    }
}

/// A row of the dataset: its global index and token ids (validated as u32 later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetRow {
    pub row: usize,
    pub input_ids: Result<Vec<u32>, String>,
}

/// Reads the `input_ids` of the rows in `shard` (all rows if `None`).
pub fn read_dataset(dir: &Path, shard: Option<Shard>) -> Result<Vec<DatasetRow>, String> {
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| {
        format!(
            "{}: {e} (not a `save_to_disk` dataset directory?)",
            state_path.display()
        )
    })?;
    let state: State =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", state_path.display()))?;
    let mut rows = Vec::new();
    for f in &state.data_files {
        read_file(&dir.join(&f.filename), &mut rows)?;
    }
    let range = shard.map_or(0..rows.len(), |s| s.range(rows.len()));
    Ok(rows.drain(range).collect())
}

fn read_file(path: &Path, rows: &mut Vec<DatasetRow>) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let file = File::open(path).map_err(|e| err(&e))?;
    let reader = StreamReader::try_new(BufReader::new(file), None).map_err(|e| err(&e))?;
    for batch in reader {
        let batch = batch.map_err(|e| err(&e))?;
        let column = input_ids_column(&batch).map_err(|e| err(&e))?;
        for i in 0..column.len() {
            let row = rows.len();
            rows.push(DatasetRow {
                row,
                input_ids: list_value(&column, i),
            });
        }
    }
    Ok(())
}

fn input_ids_column(batch: &RecordBatch) -> Result<ArrayRef, String> {
    batch
        .column_by_name("input_ids")
        .cloned()
        .ok_or_else(|| "the dataset has no `input_ids` column".to_string())
}

/// Row `i` of a list column of integers.
fn list_value(column: &ArrayRef, i: usize) -> Result<Vec<u32>, String> {
    if column.is_null(i) {
        return Err("input_ids is null".into());
    }
    let values = if let Some(l) = column.as_list_opt::<i32>() {
        l.value(i)
    } else if let Some(l) = column.as_list_opt::<i64>() {
        l.value(i)
    } else {
        return Err(format!(
            "input_ids has type {}, expected a list of integers",
            column.data_type()
        ));
    };
    let to_u32 = |v: i64| u32::try_from(v).map_err(|_| format!("token id {v} is invalid"));
    if let Some(a) = values.as_primitive_opt::<Int64Type>() {
        a.values().iter().map(|&v| to_u32(v)).collect()
    } else if let Some(a) = values.as_primitive_opt::<Int32Type>() {
        a.values().iter().map(|&v| to_u32(i64::from(v))).collect()
    } else if let Some(a) = values.as_primitive_opt::<UInt32Type>() {
        Ok(a.values().to_vec())
    } else {
        Err(format!(
            "input_ids holds {}, expected integers",
            values.data_type()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_contiguously_without_overlap() {
        for total in [0, 1, 7, 11, 100] {
            for count in 1..=5 {
                let mut covered = Vec::new();
                for index in 0..count {
                    covered.extend(Shard { index, count }.range(total));
                }
                assert_eq!(
                    covered,
                    (0..total).collect::<Vec<_>>(),
                    "{total} rows, {count} shards"
                );
            }
        }
        assert_eq!(Shard::parse("1/3").unwrap().range(11), 4..8);
    }

    #[test]
    fn shard_parse_rejects_nonsense() {
        for s in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            assert!(Shard::parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn reads_the_fixture_dataset() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/datasets/turns");
        let rows = read_dataset(&dir, None).unwrap();
        assert_eq!(rows.len(), 11);
        assert!(
            rows.iter()
                .enumerate()
                .all(|(i, r)| r.row == i && r.input_ids.is_ok())
        );
        let part = read_dataset(&dir, Some(Shard { index: 1, count: 2 })).unwrap();
        assert_eq!(part.first().map(|r| r.row), Some(6));
        assert!(read_dataset(Path::new("/nonexistent"), None).is_err());
    }
}
