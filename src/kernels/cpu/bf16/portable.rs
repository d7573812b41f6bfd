//! The bf16 paths' reference: the same operands (A rounded to bf16, the packed tiles) and the
//! same pair order, one scalar f32 accumulator per output.

use half::bf16;

use super::{Job, TILE_K, TILE_N};

fn f(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

pub(super) fn run(job: &Job<'_>) {
    let mut tile = [0f32; 256];
    for nb in job.pairs.start * 2..job.pairs.end * 2 {
        for r0 in (0..job.m).step_by(16) {
            for (i, out) in tile.iter_mut().enumerate() {
                let (r, j) = (r0 + i / 16, i % 16);
                if r >= job.m {
                    *out = 0.0;
                    continue;
                }
                let mut acc = 0f32;
                for kb in 0..job.w.k_tiles() {
                    let t = job.w.tile(nb, kb);
                    for kk in 0..TILE_K / 2 {
                        let pair = job.a_pair(r, kb, kk);
                        let b = &t[kk * TILE_K + j * 2..];
                        acc += f(pair as u16) * f(b[0]);
                        acc += f((pair >> 16) as u16) * f(b[1]);
                    }
                }
                *out = acc;
            }
            job.store_tile(r0, nb * TILE_N, &tile);
        }
    }
}
