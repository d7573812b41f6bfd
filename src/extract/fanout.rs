//! Prefix fan-out computed once: speculators makes one row per assistant turn, so most rows
//! are prefixes of a longer row. A causal model's state at token t depends only on tokens ≤ t,
//! so such a row's file is the leading rows of the longer row's file: it is sliced, not
//! recomputed.

/// For each sequence, the index of the sequence it is sliced from (`None`: computed itself).
/// Every sequence that is a prefix of (or equal to) another one maps to a sequence that is a
/// prefix of no other — the longest of its chain, so each token is computed once.
pub fn prefix_roots(seqs: &[&[u32]]) -> Vec<Option<usize>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    // Lexicographic order, ties by index so the last of identical rows is the root.
    order.sort_by(|&a, &b| seqs[a].cmp(seqs[b]).then(a.cmp(&b)));
    // If a is a prefix of some c, every sequence sorted between them also starts with a, so
    // checking the next one in order is enough.
    let mut root: Vec<Option<usize>> = vec![None; seqs.len()];
    for w in (0..order.len().saturating_sub(1)).rev() {
        let (a, next) = (order[w], order[w + 1]);
        if seqs[next].starts_with(seqs[a]) {
            root[a] = Some(root[next].unwrap_or(next));
        }
    }
    root
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_map_to_their_longest_row() {
        let rows: Vec<Vec<u32>> = vec![
            vec![1, 2],       // 0: prefix of 2 (and of 1)
            vec![1, 2, 3],    // 1: prefix of 2
            vec![1, 2, 3, 4], // 2: root
            vec![1, 5],       // 3: root (diverges)
            vec![9],          // 4: root
            vec![1, 2, 3, 4], // 5: identical to 2
        ];
        let seqs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let roots = prefix_roots(&seqs);
        assert_eq!(roots, vec![Some(5), Some(5), Some(5), None, None, None]);
        for (i, r) in roots.iter().enumerate() {
            if let Some(r) = r {
                assert!(seqs[*r].starts_with(seqs[i]));
                assert!(roots[*r].is_none(), "roots are computed themselves");
            }
        }
    }

    #[test]
    fn prefix_of_two_diverging_rows_maps_to_one_of_them() {
        let rows: Vec<Vec<u32>> = vec![vec![7], vec![7, 1], vec![7, 2]];
        let seqs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        let roots = prefix_roots(&seqs);
        assert_eq!(roots[1], None);
        assert_eq!(roots[2], None);
        assert!(matches!(roots[0], Some(1) | Some(2)));
    }

    #[test]
    fn nothing_shared_nothing_sliced() {
        let rows: Vec<Vec<u32>> = vec![vec![3, 1], vec![1, 3], vec![2]];
        let seqs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        assert_eq!(prefix_roots(&seqs), vec![None, None, None]);
        assert!(prefix_roots(&[]).is_empty());
    }
}
