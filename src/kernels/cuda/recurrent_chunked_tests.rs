//! The chunked recurrences, in both forms (f32; the tensor-core state passes), against the
//! token-serial kernels, directly, at the head sizes of real checkpoints (Gated DeltaNet dk =
//! dv = 128; Mamba-2 head_dim 64, d_state 128) and a Gated DeltaNet of dk 64, dv 48: two
//! requests in one batch; one of them continuing from its state, in a chunk that starts inside
//! a block; the same request in pieces cut at a multiple of 64 (the same bits as one pass).
//! The token-serial kernels are the ones the parity suite checks against the CPU backend and
//! transformers. Runs on the emulator (`cuda-emu`) or a GPU; skipped, saying why, where
//! neither is there.

use super::super::context::{DevBuf, Gpu, test_gpu};
use super::super::recurrent::{self, DevSeqs, GdnIo, MambaIo};
use super::*;
use crate::kernels::attention_reference::rnd;

/// Request lengths: A spans four blocks, B two.
const LENS: [usize; 2] = [200, 90];

/// max |a - b| / max |b|; NaN where either side holds a NaN (`f64::max` would pass over it).
fn max_rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let nan_max = |m: f64, x: f64| if x.is_nan() || x > m { x } else { m };
    let top = b.iter().fold(0f64, |m, v| nan_max(m, v.abs() as f64));
    let worst = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| nan_max(m, (*x as f64 - *y as f64).abs()));
    worst / top
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// One recurrent layer's random inputs for both requests: per request, per token, the rows
/// of each input buffer the kernels read (`widths`).
struct Layer {
    name: &'static str,
    widths: Vec<usize>,
    inputs: [Vec<Vec<f32>>; 2],
    params: Vec<f32>,
    out_width: usize,
    state_per_slot: usize,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Gdn {
        nk: usize,
        nv: usize,
        dk: usize,
        dv: usize,
    },
    Mamba {
        heads: usize,
        head_dim: usize,
        d_state: usize,
        groups: usize,
    },
}

impl Layer {
    fn new(name: &'static str, kind: Kind, seed: &mut u64) -> Self {
        let (widths, params, out_width, state_per_slot) = match kind {
            // qkv, then b | a; params: -exp(A_log) | dt_bias.
            Kind::Gdn { nk, nv, dk, dv } => {
                let neg_a: Vec<f32> = rnd(nv, seed).iter().map(|v| -(v.exp())).collect();
                let params = [neg_a, rnd(nv, seed)].concat();
                (
                    vec![2 * nk * dk + nv * dv, 2 * nv],
                    params,
                    nv * dv,
                    nv * dk * dv,
                )
            }
            // x | B | C, then dt; params: -exp(A_log) | D | dt_bias.
            Kind::Mamba {
                heads,
                head_dim,
                d_state,
                groups,
            } => {
                let neg_a: Vec<f32> = rnd(heads, seed).iter().map(|v| -(v.exp())).collect();
                let params = [neg_a, rnd(heads, seed), rnd(heads, seed)].concat();
                let inner = heads * head_dim;
                (
                    vec![inner + 2 * groups * d_state, heads],
                    params,
                    inner,
                    inner * d_state,
                )
            }
        };
        let inputs = LENS.map(|n| widths.iter().map(|w| rnd(n * w, seed)).collect());
        Self {
            name,
            widths,
            inputs,
            params,
            out_width,
            state_per_slot,
            kind,
        }
    }

    /// Runs one batch of chunks `(request, start, len)` (request r on slot r) in `form`, from
    /// and into `state`; returns the output rows.
    fn run(
        &self,
        gpu: &Gpu,
        state: &DevBuf<f32>,
        chunks: &[(usize, usize, usize)],
        form: Recurrence,
    ) -> Vec<f32> {
        let mut seqs = Vec::new();
        let mut bufs: Vec<Vec<f32>> = vec![Vec::new(); self.widths.len()];
        for &(r, start, len) in chunks {
            let row = seqs.last().map_or(0, |s: &SeqState| s.rows.end);
            seqs.push(SeqState {
                rows: row..row + len,
                slot: r,
                start,
            });
            for (buf, (src, w)) in bufs.iter_mut().zip(self.inputs[r].iter().zip(&self.widths)) {
                buf.extend_from_slice(&src[start * w..(start + len) * w]);
            }
        }
        let t = seqs.last().map_or(0, |s| s.rows.end);
        let dev = DevSeqs::new(gpu, &seqs, t).unwrap();
        let ins: Vec<DevBuf<f32>> = bufs.iter().map(|b| gpu.upload(b).unwrap()).collect();
        let params = gpu.upload(&self.params).unwrap();
        let out = gpu.zeros::<f32>(t * self.out_width).unwrap();
        let p = |i: usize| params.ptr() + 4 * i as u64;
        match self.kind {
            Kind::Gdn { nk, nv, dk, dv } => {
                let io = GdnIo {
                    nk,
                    nv,
                    dk,
                    dv,
                    qkv: ins[0].ptr(),
                    b: ins[1].ptr(),
                    a: ins[1].ptr() + 4 * nv as u64,
                    ba_stride: 2 * nv,
                    neg_a: p(0),
                    dt_bias: p(nv),
                    state: state.ptr(),
                    out: out.ptr(),
                    a_stride: 2 * nv,
                    beta_scale: 1.0,
                    per_channel: false,
                };
                recurrent::gated_delta(gpu, io, &dev, form).unwrap();
            }
            Kind::Mamba {
                heads,
                head_dim,
                d_state,
                groups,
            } => {
                let io = MambaIo {
                    heads,
                    head_dim,
                    d_state,
                    groups,
                    xbc: ins[0].ptr(),
                    dt: ins[1].ptr(),
                    dt_stride: heads,
                    neg_a: p(0),
                    d: p(heads),
                    dt_bias: p(2 * heads),
                    dt_min: 1e-3,
                    state: state.ptr(),
                    y: out.ptr(),
                };
                recurrent::mamba2_scan(gpu, io, &dev, form).unwrap();
            }
        }
        gpu.download(&out, t * self.out_width).unwrap()
    }

    /// Fresh states for both requests.
    fn state(&self, gpu: &Gpu) -> DevBuf<f32> {
        gpu.zeros(2 * self.state_per_slot).unwrap()
    }

    fn read(&self, gpu: &Gpu, state: &DevBuf<f32>) -> Vec<f32> {
        gpu.download(state, 2 * self.state_per_slot).unwrap()
    }
}

/// The head sizes of real checkpoints; (for the tensor-core form's edges) a Gated DeltaNet
/// with dk 64 (one row tile per warp) and dv 48 (a slab and a half); and (for the intra-block
/// output kernels, whose blocks of threads take up to 8 heads that share a Gram tile, two per
/// pass) 9 heads per key head or group: blocks of 8 and 1 heads, a pass with one head.
fn layers() -> [Layer; 5] {
    let mut seed = 7;
    [
        Layer::new(
            "gated delta rule",
            Kind::Gdn {
                nk: 2,
                nv: 4,
                dk: 128,
                dv: 128,
            },
            &mut seed,
        ),
        Layer::new(
            "mamba-2 scan",
            Kind::Mamba {
                heads: 4,
                head_dim: 64,
                d_state: 128,
                groups: 2,
            },
            &mut seed,
        ),
        Layer::new(
            "gated delta rule dk 64 dv 48",
            Kind::Gdn {
                nk: 1,
                nv: 2,
                dk: 64,
                dv: 48,
            },
            &mut seed,
        ),
        Layer::new(
            "gated delta rule 9 heads per key head",
            Kind::Gdn {
                nk: 1,
                nv: 9,
                dk: 32,
                dv: 16,
            },
            &mut seed,
        ),
        Layer::new(
            "mamba-2 scan 9 heads per group",
            Kind::Mamba {
                heads: 18,
                head_dim: 16,
                d_state: 32,
                groups: 2,
            },
            &mut seed,
        ),
    ]
}

/// Largest difference from the token-serial kernels (relative to their largest value) each
/// chunked form may show: f32 rounding for [`Recurrence::Chunked`]; for
/// [`Recurrence::Tensor`], the bf16 rounding of each block's operands.
fn tolerance(form: Recurrence) -> f64 {
    match form {
        Recurrence::Tensor => 1e-2,
        _ => 1e-5,
    }
}

/// Both requests in one batch, from zero states, each chunked form vs token-serial: outputs
/// and final states within the form's tolerance. The tensor-core form must differ from the
/// f32 one (else it did not run).
#[test]
fn chunked_matches_token_serial() {
    let Some(gpu) = test_gpu() else { return };
    let both = [(0, 0, LENS[0]), (1, 0, LENS[1])];
    for layer in layers() {
        let s_serial = layer.state(&gpu);
        let want = layer.run(&gpu, &s_serial, &both, Recurrence::Serial);
        let want_state = layer.read(&gpu, &s_serial);
        let mut outs = Vec::new();
        for form in [Recurrence::Chunked, Recurrence::Tensor] {
            let st = layer.state(&gpu);
            let got = layer.run(&gpu, &st, &both, form);
            let (e_out, e_state) = (
                max_rel(&got, &want),
                max_rel(&layer.read(&gpu, &st), &want_state),
            );
            eprintln!(
                "{}: {form:?} vs token-serial: out {e_out:.2e}, state {e_state:.2e}",
                layer.name
            );
            let tol = tolerance(form);
            assert!(
                e_out <= tol && e_state <= tol,
                "{} {form:?}: {e_out:e} / {e_state:e}",
                layer.name
            );
            assert!(got.iter().all(|v| v.is_finite()), "{}", layer.name);
            outs.push(got);
        }
        assert!(
            !same_bits(&outs[0], &outs[1]),
            "{}: tensor form",
            layer.name
        );
    }
}

/// Request A in two batches, the second continuing from A's state in a chunk that starts
/// inside a block (position 37) beside request B, within the form's tolerance of A in one
/// pass; and A cut at position 64 gives the same bits as one pass, in each chunked form.
#[test]
fn chunked_continues_from_state() {
    let Some(gpu) = test_gpu() else { return };
    let (a, w) = (LENS[0], |l: &Layer| l.out_width);
    for layer in layers() {
        for form in [Recurrence::Chunked, Recurrence::Tensor] {
            let one = layer.state(&gpu);
            let whole = layer.run(&gpu, &one, &[(0, 0, a)], form);
            for cut in [37, 64] {
                let st = layer.state(&gpu);
                let mut got = layer.run(&gpu, &st, &[(0, 0, cut)], form);
                let rest = layer.run(&gpu, &st, &[(0, cut, a - cut), (1, 0, LENS[1])], form);
                got.extend_from_slice(&rest[..(a - cut) * w(&layer)]);
                let n = layer.state_per_slot;
                let (final_a, whole_a) =
                    (&layer.read(&gpu, &st)[..n], &layer.read(&gpu, &one)[..n]);
                let e = max_rel(&got, &whole).max(max_rel(final_a, whole_a));
                eprintln!(
                    "{} {form:?}: cut at {cut}: {e:.2e} from one pass",
                    layer.name
                );
                assert!(
                    e <= tolerance(form),
                    "{} {form:?}: cut at {cut}: {e:e}",
                    layer.name
                );
                if cut % CHUNK == 0 {
                    let what = format!("{} {form:?}, cut at {cut}", layer.name);
                    assert!(same_bits(&got, &whole), "{what}");
                    assert!(same_bits(final_a, whole_a), "{what}: state");
                }
            }
        }
    }
}
