//! Issue 17.2: hostile model directories (the proptest cases of tests/soak/model_dirs.rs, a
//! short run; `cargo run --release --example soak -- model-dirs --cases N` runs long ones) and
//! the case the issue names: a tiny checkpoint whose config claims a 10^12 vocabulary fails on
//! its weights without allocating for the claim.

use std::cell::RefCell;

use crate::model_dirs::{self, Bases, Case, Mutation};
use serde_json::json;

const CASES: u32 = 1000;
/// Other tests of this binary run beside these and allocate too: the bound on one allocation
/// is loose here (a config-sized allocation of the hostile sizes is gigabytes); the soak run,
/// alone in its process, uses a tight one.
const BOUND: usize = 1 << 30;

#[test]
fn hostile_model_directories_fail_cleanly_at_load() {
    let s = model_dirs::run(CASES, 0x1702, BOUND).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{s:?}");
    assert_eq!(s.cases, u64::from(CASES));
    assert!(
        s.ran > 0 && s.refused_config > 0 && s.refused_load > 0,
        "{s:?}"
    );
    assert!(s.chat_ok > 0 && s.chat_refused > 0, "{s:?}");
}

#[test]
fn a_huge_vocabulary_claim_fails_on_the_weights_without_allocating() {
    let bases = Bases::new();
    // 10^12 is refused with the config (token ids are u32); 2^31 - 1 passes it and is refused
    // by the embedding's shape.
    let claims = [
        (0, "vocab_size", 1_000_000_000_000u64, "vocab_size"),
        (0, "vocab_size", (1 << 31) - 1, "embed_tokens"),
        (2, "vocab_size", (1 << 31) - 1, "embed_tokens"),
        (3, "hidden_size", 1 << 40, "backbone.embeddings"),
        (4, "intermediate_size", 1 << 40, "mlp"),
        // Found by the fuzzing: the RoPE table was sized from head_dim before the projections
        // were checked (an abort on a 2 TiB allocation).
        (0, "head_dim", 1 << 40, "q_proj"),
        (0, "num_hidden_layers", 1 << 40, "num_hidden_layers"),
        (2, "num_hidden_layers", 1 << 31, "num_hidden_layers"),
    ];
    for (base, field, claim, named) in claims {
        let case = Case {
            base,
            mutations: vec![Mutation::Field(field, Some(json!(claim)))],
        };
        let stats = RefCell::new(model_dirs::Stats::default());
        model_dirs::check(&bases, &case, BOUND, &stats).unwrap();
        let s = stats.into_inner();
        assert_eq!(s.ran, 0, "{field}: {s:?}");
        assert!(
            s.last_error.contains(named),
            "{field} {claim}: {}",
            s.last_error
        );
        assert!(s.largest_alloc < 16 << 20, "{s:?}");
    }
}

/// A shard index naming a file outside the model directory, or two shards holding the same
/// tensor: refused at load, naming the entry.
#[test]
fn shards_outside_the_directory_or_holding_one_tensor_twice_are_refused() {
    use crate::model_dirs::Header;
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    let bases = Bases::new();
    // Base 1 is the sharded qwen2 fixture; any entry of its index will do.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut first = || {
        (any::<proptest::sample::Index>().new_tree(&mut runner))
            .unwrap()
            .current()
    };
    let cases = [
        (
            Mutation::Shard(first(), "../llama/model.safetensors"),
            "is not a file name in the model directory",
        ),
        (
            Mutation::Shard(first(), "/etc/passwd"),
            "is not a file name in the model directory",
        ),
        (
            // A tensor of the second shard renamed onto one of the first.
            Mutation::Header(
                1,
                Header::Rename(first(), "model.embed_tokens.weight".into()),
            ),
            "is also in",
        ),
    ];
    for (mutation, expected) in cases {
        let case = Case {
            base: 1,
            mutations: vec![mutation],
        };
        let stats = RefCell::new(model_dirs::Stats::default());
        model_dirs::check(&bases, &case, BOUND, &stats).unwrap();
        let s = stats.into_inner();
        assert!(
            s.last_error.contains(expected),
            "{case:?}: {}",
            s.last_error
        );
    }
}
