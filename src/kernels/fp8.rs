//! FP8 files in speculators' `hs_connectors` layout (its `fp8_utils.quantize_tensor_to_fp8`):
//! one f32 scale per token, `amax over the token's K × H values / 448` (clamped to 1e-12),
//! and codes `(value / scale).to(torch.float8_e4m3fn)`.
//!
//! In host memory a token's fp8 row is its `K × H` codes followed by its scale (4 bytes,
//! little-endian), so rows stay self-contained for everything that cuts files by rows (the
//! runner, the connector, fan-out); the writer splits them into `hidden_states` and
//! `hidden_states_scales`. The CUDA twin of this arithmetic is in `cuda/capture.cu`.

/// Largest finite float8_e4m3fn value (`torch.finfo(torch.float8_e4m3fn).max`).
pub const FP8_MAX: f32 = 448.0;
/// Bytes of the per-token scale stored after a row's codes.
pub const SCALE_BYTES: usize = 4;
/// `quantize_tensor_to_fp8`'s lower clamp of the scale.
const MIN_SCALE: f32 = 1e-12;

/// f32 -> float8_e4m3fn bits exactly as torch's `.to(torch.float8_e4m3fn)`: round to nearest
/// even, finite overflow and infinities saturate to ±448, NaN -> 0x7f with the sign kept,
/// subnormals rounded by the FPU (c10's `fp8e4m3fn_from_fp32_value` + saturation).
pub fn e4m3fn_from_f32(f: f32) -> u8 {
    let bits = f.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return 0x7f | sign;
    }
    // 464 (halfway to the unrepresentable 480) and above rounds past 448: saturate.
    if abs >= 464.0f32.to_bits() {
        return 0x7e | sign;
    }
    let code = if abs < 121 << 23 {
        // Below 2^-6 (smallest normal): adding 2^14 leaves the value in units of 2^-9 (the
        // subnormal step) in the low mantissa bits, rounded to nearest even by the FPU.
        const DENORM: u32 = 141 << 23;
        (f32::from_bits(abs) + f32::from_bits(DENORM)).to_bits() - DENORM
    } else {
        let mant_odd = (abs >> 20) & 1;
        // Rebias the exponent (127 -> 7; abs >= 121 << 23 here) and round the 20 dropped
        // bits to nearest even.
        (abs - (120 << 23) + 0x7_ffff + mant_odd) >> 20
    };
    code as u8 | sign
}

/// float8_e4m3fn bits -> f32 (exact).
pub fn e4m3fn_to_f32(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((code >> 3) & 0xf);
    let mant = f32::from(code & 7);
    let mag = match exp {
        15 if code & 7 == 7 => f32::NAN,
        0 => mant * 2f32.powi(-9),
        e => (1.0 + mant / 8.0) * 2f32.powi(e - 7),
    };
    sign * mag
}

/// The token's scale from its values: `max(amax / 448, 1e-12)`; a NaN anywhere gives NaN
/// (torch's `amax` and `clamp` propagate it).
pub fn token_scale(values: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in values {
        if v.is_nan() {
            return f32::NAN;
        }
        amax = amax.max(v.abs());
    }
    (amax / FP8_MAX).max(MIN_SCALE)
}

/// Quantizes one token's `K × H` values into `out`: the codes, then the scale's 4 bytes.
pub fn quantize_row(values: &[f32], out: &mut [u8]) {
    let scale = token_scale(values);
    let (codes, tail) = out.split_at_mut(values.len());
    for (o, &v) in codes.iter_mut().zip(values) {
        *o = e4m3fn_from_f32(v / scale);
    }
    tail[..SCALE_BYTES].copy_from_slice(&scale.to_le_bytes());
}

/// fp8 rows of `width` codes then a scale each -> f32 values `code × scale`.
pub fn dequantize_rows(rows: &[u8], width: usize) -> Vec<f32> {
    rows.chunks_exact(width + SCALE_BYTES)
        .flat_map(|row| {
            let (codes, scale) = row.split_at(width);
            let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
            codes.iter().map(move |&c| e4m3fn_to_f32(c) * scale)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for c in 0..=255u8 {
            let v = e4m3fn_to_f32(c);
            if v.is_nan() {
                assert_eq!(c & 0x7f, 0x7f);
            } else if v == 0.0 {
                assert_eq!(e4m3fn_from_f32(v), c);
            } else {
                assert_eq!(e4m3fn_from_f32(v), c, "code {c:#x} = {v}");
            }
        }
    }

    /// The reference file of tests/fixtures/make_fp8_fixtures.py (made by torch).
    fn reference() -> Vec<u8> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/reference/fp8.safetensors"
        );
        std::fs::read(path).expect("tests/fixtures/reference/fp8.safetensors")
    }

    fn tensor<'a>(st: &'a safetensors::SafeTensors<'a>, name: &str) -> &'a [u8] {
        st.tensor(name).unwrap().data()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn sweep_matches_torch_bit_for_bit() {
        let bytes = reference();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let (inputs, codes) = (f32s(tensor(&st, "sweep_in")), tensor(&st, "sweep_codes"));
        assert!(inputs.len() > 8000);
        let wrong: Vec<_> = inputs
            .iter()
            .zip(codes)
            .filter(|&(&v, &c)| e4m3fn_from_f32(v) != c)
            .map(|(&v, &c)| (v, c, e4m3fn_from_f32(v)))
            .take(5)
            .collect();
        assert!(wrong.is_empty(), "(value, torch, hsx): {wrong:?}");
    }

    #[test]
    fn rows_match_hs_connectors_quantize() {
        let bytes = reference();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let shape = st.tensor("rows_in").unwrap().shape().to_vec();
        let width = shape[1] * shape[2];
        let inputs = f32s(tensor(&st, "rows_in"));
        let (codes, scales) = (tensor(&st, "rows_codes"), f32s(tensor(&st, "rows_scales")));
        for (t, row) in inputs.chunks_exact(width).enumerate() {
            let mut out = vec![0u8; width + SCALE_BYTES];
            quantize_row(row, &mut out);
            assert_eq!(
                &out[..width],
                &codes[t * width..][..width],
                "token {t} codes"
            );
            let scale = f32::from_le_bytes(out[width..].try_into().unwrap());
            assert_eq!(scale.to_bits(), scales[t].to_bits(), "token {t} scale");
        }
    }

    #[test]
    fn scale_is_amax_over_448_clamped() {
        assert_eq!(token_scale(&[1.0, -448.0, 3.0]), 1.0);
        assert_eq!(token_scale(&[0.0, -0.0]), 1e-12);
        assert!(token_scale(&[1.0, f32::NAN]).is_nan());
        let mut out = [0u8; 6];
        quantize_row(&[-2.0, 1.0], &mut out);
        assert_eq!(out[0], e4m3fn_from_f32(-448.0));
        assert_eq!(out[1], e4m3fn_from_f32(224.0));
        assert_eq!(
            f32::from_le_bytes(out[2..].try_into().unwrap()),
            2.0 / 448.0
        );
    }
}
