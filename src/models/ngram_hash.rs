//! Qwen4-Exp's hashed n-gram ids (transformers' `Qwen4ExpTextNGramEmbedding`), on the host:
//! each token's n-grams of orders 2..=`ngram_size` (the token and the ones before it, within
//! its EOS-delimited segment), each hashed by `heads_per_ngram` heads into their own slice of
//! one table. Per order n: `mixed = tok·m_0 ^ prev_1·m_1 ^ … ^ prev_{n-1}·m_{n-1}`, head h's id
//! `mixed mod V_h + offset_h`, where `prev_s` is the token `s` back, or `eos` where that is
//! before the sequence or an EOS lies between (`_shift_right_ignore_eos`). The multipliers
//! `m` are splitmix64 draws from `seed` and the PLE layer's index; `V_h` are the successive
//! primes after `ngram_vocab_size_base - 1`, numbered across the layers' heads.

/// The hash of one PLE layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramHash {
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    /// One per position back (0: the token itself).
    pub multipliers: Vec<u64>,
    /// `V_h` and the first row of each head's slice.
    pub vocab_sizes: Vec<u64>,
    pub offsets: Vec<u64>,
    /// Rows of the table: the heads' slices, padded to a multiple of the divisor.
    pub rows: usize,
    pub eos: u32,
}

/// What defines the hash, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramParams {
    pub vocab: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub vocab_base: u64,
    pub divisor: u64,
    pub seed: u64,
    pub eos: u32,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn splitmix64(v: u64) -> u64 {
    let v = v.wrapping_add(GAMMA);
    let v = (v ^ (v >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let v = (v ^ (v >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    v ^ (v >> 31)
}

fn is_prime(v: u64) -> bool {
    if v < 2 || (v > 2 && v.is_multiple_of(2)) {
        return v == 2;
    }
    (3..)
        .step_by(2)
        .take_while(|d| d * d <= v)
        .all(|d| !v.is_multiple_of(d))
}

impl NgramHash {
    /// The hash of the `index`-th PLE layer (its place in `ple_layer_ids`); `None` when the
    /// table would not be indexable by u32 ids.
    pub fn new(p: &NgramParams, index: usize) -> Option<Self> {
        let heads = p
            .ngram_size
            .checked_sub(1)?
            .checked_mul(p.heads_per_ngram)?;
        let half = (i64::MAX as u64 / p.vocab.max(1) as u64 / 2).max(1);
        let base = p.seed.wrapping_add(10007u64.wrapping_mul(index as u64));
        let multipliers = (1..=p.ngram_size as u64)
            .map(|i| 2 * (splitmix64(base.wrapping_add(GAMMA.wrapping_mul(i))) % half) + 1)
            .collect();
        // The primes after base - 1, numbered across the layers: this layer's are the last
        // `heads` of the first `(index + 1) · heads`.
        let mut primes = Vec::with_capacity(heads);
        let mut v = p.vocab_base.checked_sub(1)?;
        for n in 0..(index + 1).checked_mul(heads)? {
            v += 1;
            while !is_prime(v) {
                v += 1;
            }
            if n >= index * heads {
                primes.push(v);
            }
        }
        let offsets: Vec<u64> = (primes.iter())
            .scan(0u64, |at, &v| Some(std::mem::replace(at, *at + v)))
            .collect();
        let total: u64 = primes.iter().sum();
        let rows = total
            .div_ceil(p.divisor.max(1))
            .checked_mul(p.divisor.max(1))?;
        Some(Self {
            ngram_size: p.ngram_size,
            heads_per_ngram: p.heads_per_ngram,
            multipliers,
            vocab_sizes: primes,
            offsets,
            rows: u32::try_from(rows).ok()? as usize,
            eos: p.eos,
        })
    }

    /// Ids per token.
    pub fn heads(&self) -> usize {
        self.vocab_sizes.len()
    }

    /// Appends the ids of every token of `tokens`, `context` being the tokens right before
    /// them (at least `ngram_size - 1` of them, or all from the sequence's start).
    pub fn ids(&self, context: &[u32], tokens: &[u32], out: &mut Vec<u32>) {
        let history: Vec<u32> = context.iter().chain(tokens).copied().collect();
        let mut shifted = vec![0u64; self.ngram_size];
        for q in context.len()..history.len() {
            for (s, v) in shifted.iter_mut().enumerate() {
                *v = self.back(&history, q, s) as u64;
            }
            for n in 2..=self.ngram_size {
                let mixed = (0..n).fold(0u64, |m, s| {
                    m ^ shifted[s].wrapping_mul(self.multipliers[s])
                });
                let heads = (n - 2) * self.heads_per_ngram..(n - 1) * self.heads_per_ngram;
                for h in heads {
                    out.push((mixed % self.vocab_sizes[h] + self.offsets[h]) as u32);
                }
            }
        }
    }

    /// The token `s` back from `history[q]`: itself for 0; `eos` before the history's start
    /// or where an EOS lies in `history[q - s..q]`.
    fn back(&self, history: &[u32], q: usize, s: usize) -> u32 {
        match q.checked_sub(s) {
            Some(p) if !history[p..q].contains(&self.eos) || s == 0 => history[p],
            _ => self.eos,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(vocab: usize) -> NgramParams {
        NgramParams {
            vocab,
            ngram_size: 3,
            heads_per_ngram: 2,
            vocab_base: 101,
            divisor: 128,
            seed: 1234,
            eos: 2,
        }
    }

    /// The multipliers, head sizes, offsets and ids transformers 5.24 computes
    /// (`_build_layer_multipliers`, `Qwen4ExpTextNGramEmbedding` with these fields, PLE layer
    /// index 1), for tokens with EOS in the middle and at the end of the vocabulary.
    #[test]
    fn ids_match_transformers() {
        let h = NgramHash::new(&params(512), 0).unwrap();
        let m0 = [4295158889763781, 17440218147737327, 1270917961434445];
        assert_eq!(h.multipliers, m0);
        let release = NgramHash::new(&params(248320), 1).unwrap();
        assert_eq!(
            release.multipliers,
            [3352040966061, 19752442147475, 10742103100073]
        );
        let h = NgramHash::new(&params(512), 1).unwrap();
        assert_eq!(h.vocab_sizes, [113, 127, 131, 137]);
        assert_eq!(h.offsets, [0, 113, 240, 371]);
        assert_eq!(h.rows, 512);
        let tokens = [5, 2, 7, 9, 2, 2, 11, 300, 511];
        let want = [
            [57, 175, 350, 419],
            [68, 137, 369, 410],
            [74, 232, 275, 396],
            [8, 204, 305, 407],
            [47, 136, 334, 451],
            [18, 222, 271, 466],
            [100, 229, 308, 381],
            [34, 197, 351, 507],
            [85, 217, 310, 400],
        ];
        let mut ids = Vec::new();
        h.ids(&[], &tokens, &mut ids);
        assert_eq!(ids, want.concat());
        // Any cut with the tokens before it as context gives the same ids.
        for cut in 1..tokens.len() {
            let mut split = Vec::new();
            h.ids(&[], &tokens[..cut], &mut split);
            h.ids(
                &tokens[cut.saturating_sub(2)..cut],
                &tokens[cut..],
                &mut split,
            );
            assert_eq!(split, ids, "cut at {cut}");
        }
    }
}
