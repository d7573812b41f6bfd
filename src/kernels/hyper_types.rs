//! The steps of a hyper-connection (Qwen4-Exp's `Qwen4ExpTextGatedResidual`), as one device
//! op ([`Device::hyper`]): the residual stream is `streams` copies of the hidden width side by
//! side (`[T, streams · H]`), each sublayer reads a learned mix of them and adds its output to
//! each copy with its own weight. The GEMMs between the steps are the device's `matmul`.

use super::{DevResult, Device, DeviceError};

/// One hyper-connection step. `H` is the hidden width, `S` the number of streams; every
/// buffer is f32 unless it says otherwise.
pub enum HyperOp<'a, D: Device> {
    /// `out[t] = [x[t] | x[t] | …]` (`S` copies): the stream made from the embedded rows.
    Repeat {
        x: &'a D::Buf,
        streams: usize,
        out: &'a mut D::Buf,
    },
    /// RMSNorm of each `group` columns of `x`, each group with its own `group` values of `w`
    /// (`w` as wide as `x`): the zero-centred `hc_norm` (its `1 + w` made at load).
    GroupNorm {
        x: &'a D::Buf,
        w: &'a D::Vector,
        group: usize,
        eps: f64,
        out: &'a mut D::Buf,
    },
    /// `out = silu(x / divisor)`, `out` in its own kind (the up-projection's input).
    SiluDiv {
        x: &'a D::Buf,
        divisor: f32,
        out: &'a mut D::Buf,
    },
    /// `out[t, j] = mean over k of sigmoid(gates[t, k·H + j]) · normed[t, k·H + j]`, `out`
    /// (`[T, H]`, `H` = `normed`'s width / `streams`) in its own kind: the sublayer's input.
    Mix {
        normed: &'a D::Buf,
        gates: &'a D::Buf,
        streams: usize,
        out: &'a mut D::Buf,
    },
    /// Qwen4-Exp's n-gram gate, per stream k: `g = (key_k · query_k) / √H` (the dot product
    /// over the stream's `H` values), `g' = sign(g) · √max(|g|, 1e-6)`, and
    /// `out_k = sigmoid(g') · value` (`key`, `query`, `out` `[T, S·H]`, `value` `[T, H]`).
    NgramGate {
        key: &'a D::Buf,
        query: &'a D::Buf,
        value: &'a D::Buf,
        out: &'a mut D::Buf,
    },
    /// `x[t, k·H + j] += y[t, j] · (2 · sigmoid(logits[t, k] / S))`, `S` = the width of
    /// `logits`: the sublayer's output added to every stream.
    Inject {
        x: &'a mut D::Buf,
        logits: &'a D::Buf,
        y: &'a D::Buf,
    },
}

/// The number of streams in rows of `width` made of `hidden`-wide pieces (both devices' check).
pub fn hyper_streams(width: usize, hidden: usize, what: &str) -> DevResult<usize> {
    match hidden > 0 && width > 0 && width.is_multiple_of(hidden) {
        true => Ok(width / hidden),
        false => Err(DeviceError::Invalid(format!(
            "{what}: rows of {width} are not streams of {hidden}"
        ))),
    }
}

/// The hidden width of rows of `width` made of `streams > 0` equal pieces.
pub fn hyper_hidden(width: usize, streams: usize, what: &str) -> DevResult<usize> {
    match streams > 0 && width > 0 && width.is_multiple_of(streams) {
        true => Ok(width / streams),
        false => Err(DeviceError::Invalid(format!(
            "{what}: rows of {width} are not {streams} streams"
        ))),
    }
}

/// The output rows of [`Device::table_rows`]: `ids` ids, `per_row` to a row.
pub fn table_id_rows(ids: usize, per_row: usize) -> DevResult<usize> {
    match per_row > 0 && ids.is_multiple_of(per_row) {
        true => Ok(ids / per_row),
        false => Err(DeviceError::Invalid(format!(
            "{ids} table ids in rows of {per_row}"
        ))),
    }
}

/// A `w_len`-value weight in groups of `group` fits rows of `width`.
pub fn hyper_group_norm_fits(w_len: usize, group: usize, width: usize) -> DevResult<()> {
    match w_len == width && group > 0 && width.is_multiple_of(group) {
        true => Ok(()),
        false => Err(DeviceError::Invalid(format!(
            "hyper-connection norm: a {w_len}-value weight in groups of {group} over \
             {width}-wide rows"
        ))),
    }
}

/// Two operands of `what` have the same shape (`[rows, width]`).
pub fn hyper_same_shape(a: (usize, usize), b: (usize, usize), what: &str) -> DevResult<()> {
    match a == b {
        true => Ok(()),
        false => Err(DeviceError::Invalid(format!("{what}: {a:?} against {b:?}"))),
    }
}
