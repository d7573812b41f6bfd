//! `hsx inspect`: checks hidden-state files before anyone trains on them — shape, dtype, T
//! against `token_ids`, non-finite values, all-zero rows (the symptoms of vLLM's hybrid-model
//! bugs, speculators#613 and #966), and per-layer norms.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

use crate::actors::connector::SCALES_TENSOR;
use crate::kernels::fp8::e4m3fn_to_f32;

/// Norm statistics of one layer slot over all rows.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerStats {
    /// The layer id from the metadata, when present.
    pub layer_id: Option<usize>,
    pub mean_norm: f64,
    pub max_norm: f64,
    pub nonfinite: usize,
    pub zero_rows: usize,
}

/// What `inspect` found in one file.
#[derive(Debug, Clone, Default)]
pub struct FileReport {
    pub path: PathBuf,
    pub bytes: u64,
    /// (name, dtype, shape) of every tensor.
    pub tensors: Vec<(String, String, Vec<usize>)>,
    pub num_tokens: usize,
    pub layers: Vec<LayerStats>,
    pub metadata: HashMap<String, String>,
    /// Why the file is bad; empty when it is good.
    pub problems: Vec<String>,
}

impl FileReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Inspects one file; unreadable or malformed files give a report with problems, not an error.
pub fn inspect_file(path: &Path) -> FileReport {
    let mut report = FileReport {
        path: path.to_owned(),
        ..Default::default()
    };
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return report.with_problem(format!("cannot open: {e}")),
    };
    report.bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    // SAFETY: the map is read-only and dropped before returning; a file truncated meanwhile
    // by another process is the only hazard, as with any mmap reader (safetensors' own).
    let map = match unsafe { memmap2::Mmap::map(&file) } {
        Ok(m) => m,
        Err(e) => return report.with_problem(format!("cannot map: {e}")),
    };
    let st = match SafeTensors::deserialize(&map) {
        Ok(st) => st,
        Err(e) => return report.with_problem(format!("not a valid safetensors file: {e}")),
    };
    if let Ok((_, meta)) = SafeTensors::read_metadata(&map) {
        report.metadata = meta.metadata().clone().unwrap_or_default();
    }
    let mut names = st.names();
    names.sort();
    for name in &names {
        if let Ok(t) = st.tensor(name) {
            let dtype = format!("{:?}", t.dtype());
            report
                .tensors
                .push((name.to_string(), dtype, t.shape().to_vec()));
        }
    }
    check_tensors(&st, &mut report);
    report
}

impl FileReport {
    fn with_problem(mut self, p: String) -> Self {
        self.problems.push(p);
        self
    }
}

fn check_tensors(st: &SafeTensors<'_>, report: &mut FileReport) {
    let (hs, tok) = match (st.tensor("hidden_states"), st.tensor("token_ids")) {
        (Ok(h), Ok(t)) => (h, t),
        _ => {
            report
                .problems
                .push("missing hidden_states or token_ids".into());
            return;
        }
    };
    let fp8 = hs.dtype() == Dtype::F8_E4M3;
    let expected = if fp8 { 3 } else { 2 };
    let extra = report.tensors.len().saturating_sub(expected);
    if extra > 0 {
        report
            .problems
            .push(format!("{extra} unexpected extra tensor(s)"));
    }
    if tok.dtype() != Dtype::I64 || tok.shape().len() != 1 {
        report.problems.push(format!(
            "token_ids must be int64 [T], found {:?} {:?}",
            tok.dtype(),
            tok.shape()
        ));
    }
    let shape = hs.shape();
    if shape.len() != 3 {
        report
            .problems
            .push(format!("hidden_states must be [T, K, H], found {shape:?}"));
        return;
    }
    report.num_tokens = shape[0];
    if tok.shape().first() != Some(&shape[0]) {
        report.problems.push(format!(
            "hidden_states has {} rows but token_ids has {:?} entries",
            shape[0],
            tok.shape().first()
        ));
    }
    let values = if fp8 {
        match fp8_scales(st, shape[0]) {
            Ok(scales) => dequantize(hs.data(), &scales, shape[1] * shape[2]),
            Err(p) => return report.problems.push(p),
        }
    } else if let Some(values) = widen(hs.dtype(), hs.data()) {
        values
    } else {
        let dtype = hs.dtype();
        report.problems.push(format!(
            "hidden_states dtype {dtype:?} is not f32/bf16/f16/fp8"
        ));
        return;
    };
    let ids = layer_ids(&report.metadata);
    report.layers = layer_stats(&values, shape[0], shape[1], shape[2], ids.as_deref());
    for (k, l) in report.layers.iter().enumerate() {
        if l.nonfinite > 0 {
            report
                .problems
                .push(format!("layer slot {k}: {} non-finite values", l.nonfinite));
        }
        if l.zero_rows > 0 {
            report
                .problems
                .push(format!("layer slot {k}: {} all-zero rows", l.zero_rows));
        }
    }
}

fn widen(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytemuck::pod_collect_to_vec(data),
        Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(data)
            .into_iter()
            .map(f32::from)
            .collect(),
        Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(data)
            .into_iter()
            .map(f32::from)
            .collect(),
        _ => return None,
    })
}

/// An fp8 file's per-token scales: `hidden_states_scales` f32 `[T, 1, 1]`.
fn fp8_scales(st: &SafeTensors<'_>, t: usize) -> Result<Vec<f32>, String> {
    let Ok(sc) = st.tensor(SCALES_TENSOR) else {
        return Err(format!("fp8 hidden_states without {SCALES_TENSOR}"));
    };
    if sc.dtype() != Dtype::F32 || sc.shape() != [t, 1, 1] {
        return Err(format!(
            "{SCALES_TENSOR} must be f32 [{t}, 1, 1], found {:?} {:?}",
            sc.dtype(),
            sc.shape()
        ));
    }
    Ok(bytemuck::pod_collect_to_vec(sc.data()))
}

/// fp8 codes `[T, width]` times their token's scale.
fn dequantize(codes: &[u8], scales: &[f32], width: usize) -> Vec<f32> {
    codes
        .chunks_exact(width.max(1))
        .zip(scales)
        .flat_map(|(row, &s)| row.iter().map(move |&c| e4m3fn_to_f32(c) * s))
        .collect()
}

fn layer_ids(meta: &HashMap<String, String>) -> Option<Vec<usize>> {
    serde_json::from_str(meta.get("layer_ids")?).ok()
}

fn layer_stats(v: &[f32], t: usize, k: usize, h: usize, ids: Option<&[usize]>) -> Vec<LayerStats> {
    (0..k)
        .map(|slot| {
            let mut stats = LayerStats {
                layer_id: ids.and_then(|ids| ids.get(slot).copied()),
                mean_norm: 0.0,
                max_norm: 0.0,
                nonfinite: 0,
                zero_rows: 0,
            };
            for row in 0..t {
                let x = &v[(row * k + slot) * h..][..h];
                stats.nonfinite += x.iter().filter(|a| !a.is_finite()).count();
                if x.iter().all(|&a| a == 0.0) {
                    stats.zero_rows += 1;
                }
                let norm = x
                    .iter()
                    .map(|&a| f64::from(a) * f64::from(a))
                    .sum::<f64>()
                    .sqrt();
                stats.mean_norm += norm / t.max(1) as f64;
                stats.max_norm = stats.max_norm.max(norm);
            }
            stats
        })
        .collect()
}

/// The files named by `paths` (directories expand to their `*.safetensors`, sorted).
pub fn collect_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    Ok(files)
}

/// One file, in detail.
pub fn format_file(r: &FileReport) -> String {
    let mut s = format!("{} ({} bytes)\n", r.path.display(), r.bytes);
    for (name, dtype, shape) in &r.tensors {
        let _ = writeln!(s, "  {name}: {dtype} {shape:?}");
    }
    let mut meta: Vec<_> = r.metadata.iter().collect();
    meta.sort();
    for (k, v) in meta {
        let _ = writeln!(s, "  meta {k} = {v}");
    }
    for (slot, l) in r.layers.iter().enumerate() {
        let id = l.layer_id.map_or("?".into(), |i| i.to_string());
        let _ = writeln!(
            s,
            "  slot {slot} (layer {id}): mean norm {:.4}, max norm {:.4}, non-finite {}, zero rows {}",
            l.mean_norm, l.max_norm, l.nonfinite, l.zero_rows
        );
    }
    let verdict = if r.is_ok() {
        "OK".into()
    } else {
        format!("BAD: {}", r.problems.join("; "))
    };
    let _ = writeln!(s, "  {verdict}");
    s
}

/// The summary of many files.
pub fn format_summary(reports: &[FileReport]) -> String {
    let tokens: usize = reports.iter().map(|r| r.num_tokens).sum();
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let bad: Vec<&FileReport> = reports.iter().filter(|r| !r.is_ok()).collect();
    let mut s = format!(
        "files {}  tokens {}  bytes {}  bad {}\n",
        reports.len(),
        tokens,
        bytes,
        bad.len()
    );
    for r in bad {
        let _ = writeln!(s, "  BAD {}: {}", r.path.display(), r.problems.join("; "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_zero_rows_and_nonfinite() {
        // T = 2, K = 2, H = 2; slot 1 of row 0 is all zero, slot 0 of row 1 holds a NaN.
        let v = [3.0, 4.0, 0.0, 0.0, f32::NAN, 1.0, 0.0, 2.0];
        let s = layer_stats(&v, 2, 2, 2, Some(&[0, 4]));
        assert_eq!(s[0].nonfinite, 1);
        assert_eq!(s[1].zero_rows, 1);
        assert_eq!(s[1].layer_id, Some(4));
        assert_eq!(s[1].max_norm, 2.0);
    }

    fn fp8_file(dir: &Path, scales: Option<&[f32]>) -> PathBuf {
        use safetensors::tensor::TensorView;
        // T = 2, K = 1, H = 2: codes of 448 and 224, then 0 and -448 (sign bit set).
        let codes = [0x7e, 0x76, 0x00, 0xfe];
        let ids: Vec<u8> = [5i64, 6].iter().flat_map(|i| i.to_le_bytes()).collect();
        let sc: Vec<u8> = scales
            .unwrap_or(&[])
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let mut tensors = vec![
            (
                "hidden_states",
                TensorView::new(Dtype::F8_E4M3, vec![2, 1, 2], &codes).unwrap(),
            ),
            (
                "token_ids",
                TensorView::new(Dtype::I64, vec![2], &ids).unwrap(),
            ),
        ];
        if scales.is_some() {
            let view = TensorView::new(Dtype::F32, vec![2, 1, 1], &sc).unwrap();
            tensors.push((SCALES_TENSOR, view));
        }
        let p = dir.join(format!("fp8-{}.safetensors", scales.is_some()));
        safetensors::serialize_to_file(tensors, None, &p).unwrap();
        p
    }

    #[test]
    fn fp8_files_are_dequantized_for_the_checks() {
        let dir = tempfile::tempdir().unwrap();
        let r = inspect_file(&fp8_file(dir.path(), Some(&[0.25, 1.0 / 448.0])));
        assert!(r.is_ok(), "{:?}", r.problems);
        // Row 0: (112, 56) -> norm 125.22; row 1: (0, -1) -> norm 1.
        let want = (112f64 * 112.0 + 56.0 * 56.0).sqrt();
        assert!((r.layers[0].max_norm - want).abs() < 1e-9);
        assert!((r.layers[0].mean_norm - (want + 1.0) / 2.0).abs() < 1e-9);
        let r = inspect_file(&fp8_file(dir.path(), None));
        assert!(r.problems[0].contains(SCALES_TENSOR), "{:?}", r.problems);
    }

    #[test]
    fn garbage_file_is_bad_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.safetensors");
        std::fs::write(&p, b"not a safetensors file").unwrap();
        let r = inspect_file(&p);
        assert!(!r.is_ok());
        let r = inspect_file(&dir.path().join("missing.safetensors"));
        assert!(r.problems[0].contains("cannot open"));
    }
}
