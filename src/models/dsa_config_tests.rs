use std::path::Path;

use serde_json::{Value, json};

use super::*;

fn parse(v: &Value, arch: Architecture, layers: usize) -> Result<Option<DsaSpec>, String> {
    let cfg = Cfg::new(v, Path::new("config.json")).unwrap();
    dsa_spec(&cfg, arch, layers, 64).map_err(|e| e.to_string())
}

/// The classes' defaults, a config's own geometry, and nothing for the other families.
#[test]
fn geometry_comes_from_the_config_or_the_class() {
    let ds = parse(&json!({}), Architecture::DeepseekV32, 3)
        .unwrap()
        .unwrap();
    let want = (64, 128, 2048, false, vec![true; 3]);
    assert_eq!(
        (ds.heads, ds.head_dim, ds.topk, ds.interleave, ds.own),
        want
    );
    let v = json!({"index_n_heads": 4, "index_head_dim": 64, "index_topk": 8});
    let glm = parse(&v, Architecture::GlmMoeDsa, 1).unwrap().unwrap();
    assert_eq!(
        (glm.heads, glm.head_dim, glm.topk, glm.interleave),
        (4, 64, 8, true)
    );
    assert_eq!(parse(&v, Architecture::DeepseekV3, 1), Ok(None));
}

/// GLM-5's indexer_types, else its pattern, else the freq / offset schedule (transformers'
/// `GlmMoeDsaConfig.__post_init__`), and each layer's place among the indexer layers.
#[test]
fn glm_layers_run_or_share_an_indexer() {
    let own = |v: Value, n| parse(&v, Architecture::GlmMoeDsa, n).map(|s| s.unwrap().own);
    let v = json!({"indexer_types": ["full", "shared", "full", "shared"]});
    assert_eq!(own(v, 4), Ok(vec![true, false, true, false]));
    assert_eq!(
        own(json!({"index_topk_pattern": "FFSF"}), 4),
        Ok(vec![true, true, false, true])
    );
    let list = json!({"index_topk_pattern": ["full", "shared"]});
    assert_eq!(own(list, 2), Ok(vec![true, false]));
    // Defaults: freq 1, offset 2: every layer full.
    assert_eq!(own(json!({}), 3), Ok(vec![true; 3]));
    // freq 3, offset 2: full where max(i - 1, 0) % 3 == 0.
    let sched = json!({"index_topk_freq": 3, "index_skip_topk_offset": 2});
    let want = vec![true, true, false, false, true, false, false, true];
    assert_eq!(own(sched, 8), Ok(want));
    let s = parse(
        &json!({"index_topk_pattern": "FSFFS"}),
        Architecture::GlmMoeDsa,
        5,
    );
    let s = s.unwrap().unwrap();
    let places: Vec<_> = (0..5).map(|i| s.index_layer(i)).collect();
    assert_eq!(places, [Some(0), None, Some(1), Some(2), None]);
    assert_eq!(s.indexer_layers(), 3);
}

/// Each bad field is refused by name.
#[test]
fn bad_indexer_fields_are_refused_by_name() {
    let err = |v: Value| parse(&v, Architecture::GlmMoeDsa, 2).unwrap_err();
    assert!(err(json!({"index_topk": 0})).contains("index_topk"));
    assert!(err(json!({"index_head_dim": 32})).contains("index_head_dim"));
    assert!(err(json!({"index_n_heads": 0})).contains("index_head_dim"));
    assert!(err(json!({"indexer_types": ["shared", "full"]})).contains("indexer_types"));
    assert!(err(json!({"indexer_types": ["full", "half"]})).contains("half"));
    assert!(err(json!({"indexer_types": ["full"]})).contains("indexer_types"));
    assert!(err(json!({"index_topk_pattern": "FX"})).contains("index_topk_pattern"));
    assert!(err(json!({"index_topk_pattern": "F"})).contains("index_topk_pattern"));
}
