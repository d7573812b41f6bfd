//! The routing of one MoE layer, planned on the host from the router's top-k choice (every
//! device): rows in expert order (tokens ascending inside an expert), each expert's row range,
//! and per token the rows and weights of its experts in ascending expert order — the order
//! the combine adds them in, so every device sums a token's experts the same way.

fn index(v: usize) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("MoE row {v} exceeds i32"))
}

/// Group-limited top-k (transformers' `NemotronHTopkRouter`, DeepSeek-V3's scheme): scores
/// `s` of the logits ([`RouterScore`]); the choice ranks `s + e_score_correction_bias`, only
/// inside the `topk_group` groups (of `n_group` equal expert ranges) with the largest sum of
/// their two best choice values (or their best one: [`GroupRank`]); the weights are the chosen experts' uncorrected `s`, divided
/// by their sum plus `renorm_eps` when `renorm`, times `scale` (`routed_scaling_factor`). Ties go to the
/// lower group / expert index.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupedTopK {
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub renorm: bool,
    /// Added to the renormalising sum: [`DEFAULT_RENORM_EPS`] (DeepSeek-V3's 1e-20), LFM2-MoE's
    /// 1e-6.
    pub renorm_eps: f32,
    /// What ranks the groups.
    pub group_rank: GroupRank,
    pub scale: f32,
    pub score: RouterScore,
}

/// What a grouped router ranks its groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRank {
    /// The sum of the group's two best choice values (DeepSeek-V3 and those after it).
    TopTwoSum,
    /// The group's best choice value (DeepSeek-V2's `group_limited_greedy`).
    Best,
}

/// The renormalising sum's epsilon of DeepSeek-V3's router and those written after it.
pub const DEFAULT_RENORM_EPS: f32 = 1e-20;

/// A grouped router's scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterScore {
    /// `sigmoid(logit)` (DeepSeek-V3, GLM-4.5, MiniMax-M2, Nemotron 3).
    Sigmoid,
    /// `sigmoid(logit)`, but the choice ranks `logit + bias` (Llama-4's router: the top-k of
    /// the logits, weighted by their sigmoid; f32's sigmoid ties every logit above ~17 at 1).
    SigmoidByLogit,
    /// The softmax of the token's logits (Mistral 4: DeepSeek-V2's group-limited router).
    Softmax,
}

impl RouterScore {
    /// The CUDA kernel's `score` argument.
    pub fn code(self) -> i32 {
        match self {
            Self::Sigmoid => 0,
            Self::SigmoidByLogit => 1,
            Self::Softmax => 2,
        }
    }
}

impl GroupedTopK {
    /// Experts per group, when `experts` fits this choice (what transformers needs to run it:
    /// whole groups of at least 2, enough experts in the kept groups).
    pub fn group_size(&self, experts: usize) -> Result<usize, String> {
        let g = self.n_group;
        if g == 0 || !experts.is_multiple_of(g) || experts / g < 2 {
            return Err(format!(
                "{experts} experts do not split into {g} groups of at least 2"
            ));
        }
        let size = experts / g;
        if self.topk_group == 0 || self.topk_group > g {
            return Err(format!("topk_group {} of {g} groups", self.topk_group));
        }
        if self.top_k == 0 || self.top_k > self.topk_group * size {
            return Err(format!(
                "top-{} of the {} experts in {} groups",
                self.top_k,
                self.topk_group * size,
                self.topk_group
            ));
        }
        Ok(size)
    }
}

/// The routing of one MoE layer in expert order.
#[derive(Debug, PartialEq)]
pub struct Routing {
    /// Tokens routed (T).
    pub tokens: usize,
    /// Token of each expert-ordered row.
    pub rows: Vec<i32>,
    /// Expert e's rows are `offsets[e]..offsets[e + 1]`.
    pub offsets: Vec<usize>,
    /// `[T, k]`: row of token t's i-th expert, ascending expert order.
    pub tok_pos: Vec<i32>,
    /// `[T, k]`: the matching routing weights.
    pub tok_w: Vec<f32>,
}

impl Routing {
    /// From the device's `ids` / `wts` (`[T, k]`, ids in descending-probability order).
    pub fn build(
        ids: &[i32],
        wts: &[f32],
        t: usize,
        k: usize,
        experts: usize,
    ) -> Result<Self, String> {
        let mut counts = vec![0usize; experts];
        for &e in ids {
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < experts)
                .ok_or_else(|| format!("router chose expert {e}"))?;
            counts[e] += 1;
        }
        let mut offsets = Vec::with_capacity(experts + 1);
        offsets.push(0);
        for c in &counts {
            offsets.push(offsets.last().copied().unwrap_or(0) + c);
        }
        let mut fill = offsets[..experts].to_vec();
        let mut rows = vec![0i32; t * k];
        let (mut tok_pos, mut tok_w) = (Vec::with_capacity(t * k), Vec::with_capacity(t * k));
        let mut mine: Vec<(usize, usize, f32)> = Vec::with_capacity(k);
        for tok in 0..t {
            mine.clear();
            for i in 0..k {
                let e = ids[tok * k + i] as usize;
                let pos = fill[e];
                fill[e] += 1;
                rows[pos] = index(tok)?;
                mine.push((e, pos, wts[tok * k + i]));
            }
            mine.sort_by_key(|&(e, _, _)| e);
            for &(_, pos, w) in &mine {
                tok_pos.push(index(pos)?);
                tok_w.push(w);
            }
        }
        Ok(Self {
            tokens: t,
            rows,
            offsets,
            tok_pos,
            tok_w,
        })
    }
}

impl Routing {
    /// Llama-4 weighs each expert's input, not its output: the weight of every expert-ordered
    /// row (to scale the gathered rows by), the routing's own weights left at 1 (so the
    /// combine adds the experts' outputs as they are: `1 · y` is `y` exactly).
    pub fn take_row_weights(&mut self) -> Vec<f32> {
        let mut w = vec![0.0; self.rows.len()];
        for (&pos, tw) in self.tok_pos.iter().zip(&mut self.tok_w) {
            w[pos as usize] = std::mem::replace(tw, 1.0);
        }
        w
    }

    /// Each token's weight of expert `e` times `scale[e]` (Gemma 4's `per_expert_scale`, in f32
    /// after the top-k's renormalisation, as transformers).
    pub fn scale_by_expert(&mut self, scale: &[f32]) {
        for (&pos, w) in self.tok_pos.iter().zip(&mut self.tok_w) {
            // The expert whose row span holds `pos`: the last offset at or before it.
            let e = self.offsets.partition_point(|&o| o <= pos as usize) - 1;
            *w *= scale[e];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_scales_follow_the_experts() {
        // 2 tokens, top-2 of 4 experts: token 0 -> experts 3, 1; token 1 -> experts 1, 2.
        let mut r = Routing::build(&[3, 1, 1, 2], &[0.75, 0.25, 0.5, 0.5], 2, 2, 4).unwrap();
        r.scale_by_expert(&[10.0, 2.0, 3.0, 4.0]);
        // Ascending expert order per token: token 0 (1, 3), token 1 (1, 2).
        assert_eq!(r.tok_w, [0.25 * 2.0, 0.75 * 4.0, 0.5 * 2.0, 0.5 * 3.0]);
    }

    #[test]
    fn row_weights_follow_the_rows_and_leave_unit_weights() {
        // 3 tokens, top-2 of 4 experts: rows 0, 1 expert 0 (tokens 0, 1), row 2 expert 1
        // (token 2), rows 3, 4 expert 2 (tokens 0, 2), row 5 expert 3 (token 1).
        let ids = [2, 0, 0, 3, 2, 1];
        let wts = [0.6, 0.4, 0.7, 0.3, 0.5, 0.25];
        let mut r = Routing::build(&ids, &wts, 3, 2, 4).unwrap();
        let rows = r.rows.clone();
        assert_eq!(r.take_row_weights(), vec![0.4, 0.7, 0.25, 0.6, 0.5, 0.3]);
        assert_eq!(r.rows, rows);
        assert!(r.tok_w.iter().all(|&w| w == 1.0));
    }

    #[test]
    fn routing_orders_rows_by_expert_then_token() {
        // 3 tokens, top-2 of 4 experts.
        let ids = [2, 0, 0, 3, 2, 1];
        let wts = [0.6, 0.4, 0.7, 0.3, 0.5, 0.5];
        let r = Routing::build(&ids, &wts, 3, 2, 4).unwrap();
        assert_eq!(r.offsets, vec![0, 2, 3, 5, 6]);
        // expert 0: tokens 0, 1; expert 1: token 2; expert 2: tokens 0, 2; expert 3: token 1
        assert_eq!(r.rows, vec![0, 1, 2, 0, 2, 1]);
        // token 0: experts 0 (row 0, 0.4), 2 (row 3, 0.6)
        assert_eq!(&r.tok_pos[..2], &[0, 3]);
        assert_eq!(&r.tok_w[..2], &[0.4, 0.6]);
        assert_eq!(&r.tok_pos[2..4], &[1, 5]);
        assert_eq!(&r.tok_pos[4..], &[2, 4]);
        assert!(Routing::build(&[4, 0], &[0.5, 0.5], 1, 2, 4).is_err());
    }

    /// A step where most experts receive no token: their row ranges are empty (the MoE block
    /// skips their GEMMs), the chosen ones hold the token.
    #[test]
    fn experts_without_tokens_get_empty_ranges() {
        let r = Routing::build(&[5, 1], &[0.7, 0.3], 1, 2, 8).unwrap();
        assert_eq!(r.offsets, vec![0, 0, 1, 1, 1, 1, 2, 2, 2]);
        assert_eq!(
            (r.rows, r.tok_pos, r.tok_w),
            (vec![0, 0], vec![0, 1], vec![0.3, 0.7])
        );
        assert_eq!(r.tokens, 1);
    }
}
