//! MXFP4 expert weights (gpt-oss checkpoints as OpenAI releases them): per block of 32 values
//! along a row, one E8M0 scale byte (`2^(s - 127)`) and 32 FP4 (E2M1) codes, two per byte, the
//! even element in the low nibble. Dequantised at load exactly as transformers'
//! `integrations.mxfp4.convert_moe_packed_tensors` does: `lut[code] · 2^(scale - 127)`, every
//! product exact in f32 (and in bf16: a code has at most two significant bits).

use super::ModelError;

/// The FP4 (E2M1) values by code (transformers' `FP4_VALUES`).
const FP4_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Values per scale.
pub const BLOCK: usize = 32;

/// `[rows, cols]` f32 values of one matrix from its `blocks` (`[rows, cols / 32, 16]` bytes)
/// and `scales` (`[rows, cols / 32]`); `name` for errors.
pub fn dequantize(
    name: &str,
    blocks: &[u8],
    scales: &[u8],
    (rows, cols): (usize, usize),
) -> Result<Vec<f32>, ModelError> {
    let groups = cols / BLOCK;
    let bad = |m: String| ModelError::InvalidOptions(format!("MXFP4 tensor `{name}`: {m}"));
    if !cols.is_multiple_of(BLOCK)
        || blocks.len() != rows * groups * BLOCK / 2
        || scales.len() != rows * groups
    {
        return Err(bad(format!(
            "{} block bytes and {} scales for [{rows}, {cols}]",
            blocks.len(),
            scales.len()
        )));
    }
    if let Some(i) = scales.iter().position(|&s| s == 0xFF) {
        return Err(bad(format!("scale {i} is E8M0's NaN (0xFF)")));
    }
    let mut out = Vec::with_capacity(rows * cols);
    for (block, &scale) in blocks.chunks_exact(BLOCK / 2).zip(scales) {
        // 2^(scale - 127), exact in f32 for every scale below 0xFF (2^-127 is subnormal).
        let factor = (2f64).powi(i32::from(scale) - 127) as f32;
        for &byte in block {
            out.push(FP4_VALUES[usize::from(byte & 0x0F)] * factor);
            out.push(FP4_VALUES[usize::from(byte >> 4)] * factor);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_low_first_and_scales_per_block() {
        // Row 0: one block of 32 codes 0..15, 0..15 at scale 2^1; row 1 at 2^-2.
        let codes: Vec<u8> = (0..32).map(|i| (i % 16) as u8).collect();
        let bytes: Vec<u8> = codes.chunks(2).map(|p| p[0] | (p[1] << 4)).collect();
        let blocks = [bytes.clone(), bytes].concat();
        let got = dequantize("t", &blocks, &[128, 125], (2, 32)).unwrap();
        for (i, &c) in codes.iter().enumerate() {
            assert_eq!(got[i], FP4_VALUES[c as usize] * 2.0);
            assert_eq!(got[32 + i], FP4_VALUES[c as usize] * 0.25);
        }
        assert_eq!(got[1], 1.0);
        assert_eq!(got[15].to_bits(), (-6.0f32 * 2.0).to_bits());
    }

    #[test]
    fn bad_sizes_and_nan_scales_are_refused() {
        assert!(dequantize("t", &[0; 16], &[127], (1, 16)).is_err());
        assert!(dequantize("t", &[0; 15], &[127], (1, 32)).is_err());
        let e = dequantize("t", &[0; 16], &[0xFF], (1, 32))
            .unwrap_err()
            .to_string();
        assert!(e.contains("NaN"), "{e}");
    }
}
