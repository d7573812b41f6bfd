//! Unit tests of `config.rs`.

use super::*;

const MINIMAL: &str = "[model]\npath = \"m\"\n";

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.engine.block_size, 16);
    assert_eq!(c.engine.dtype, DtypeChoice::Auto);
    assert_eq!(c.engine.max_pending_bytes, 2 << 30);
    c.validate().unwrap();
}

#[test]
fn unknown_key_is_named() {
    let err = Config::parse("[model]\npath = \"m\"\n[engine]\nmax_tokenz = 3\n").unwrap_err();
    assert!(err.to_string().contains("max_tokenz"), "{err}");
    let err = Config::parse("[model]\npath = \"m\"\n[bogus]\n").unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn zero_budget_rejected() {
    let mut c = Config::parse(MINIMAL).unwrap();
    c.engine.max_num_batched_tokens = 0;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("max_num_batched_tokens"), "{err}");
}

#[test]
fn default_layers_follow_speculators() {
    assert_eq!(resolve_layer_ids(None, 32).unwrap(), vec![2, 16, 29, 32]);
    assert_eq!(resolve_layer_ids(None, 4).unwrap(), vec![1, 2, 4]);
    assert_eq!(resolve_layer_ids(None, 1).unwrap(), vec![0, 1]);
}

#[test]
fn configured_layers_come_out_ascending() {
    assert_eq!(
        resolve_layer_ids(Some(&[4, 0, 2]), 4).unwrap(),
        vec![0, 2, 4]
    );
}

#[test]
fn duplicate_and_out_of_range_layers_rejected() {
    let e = resolve_layer_ids(Some(&[1, 3, 1]), 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = resolve_layer_ids(Some(&[5]), 4).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
    assert!(resolve_layer_ids(Some(&[]), 4).is_err());
}

#[test]
fn overrides_apply() {
    let mut c = Config::parse(MINIMAL).unwrap();
    c.apply(&Overrides {
        layers: Some(vec![1]),
        max_num_batched_tokens: Some(7),
        dtype: Some(DtypeChoice::Bf16),
        ..Default::default()
    });
    assert_eq!(c.engine.layer_ids, Some(vec![1]));
    assert_eq!(c.engine.max_num_batched_tokens, 7);
    assert_eq!(c.engine.dtype, DtypeChoice::Bf16);
}

#[test]
fn daemon_sections_parse_and_validate() {
    let text = "[model]\npath = \"m\"\n[socket]\npath = \"s.sock\"\nmode = 0o660\n\
                [http]\naddress = \"127.0.0.1:0\"\n[metrics]\nenabled = false\n\
                [logging]\nformat = \"json\"\nlevel = \"debug\"\n\
                [output]\nallow_custom_paths = true\n";
    let c = Config::parse(text).unwrap();
    c.validate().unwrap();
    assert_eq!(c.socket.mode, 0o660);
    assert_eq!(c.http.as_ref().unwrap().address, "127.0.0.1:0");
    assert!(!c.metrics.enabled && c.output.allow_custom_paths);
    assert_eq!(c.logging.format, LogFormat::Json);
    let c = Config::parse(MINIMAL).unwrap();
    assert!(c.http.is_none() && c.metrics.enabled);
    assert_eq!(c.socket.mode, 0o600);
    let err = Config::parse("[model]\npath = \"m\"\n[socket]\nmod = 1\n").unwrap_err();
    assert!(err.to_string().contains("mod"), "{err}");
    let mut c = Config::parse(MINIMAL).unwrap();
    c.apply(&Overrides {
        http: Some("nonsense".into()),
        ..Default::default()
    });
    assert!(
        c.validate()
            .unwrap_err()
            .to_string()
            .contains("http.address")
    );
    c.http = None;
    c.socket.mode = 0o1777;
    assert!(c.validate().is_err());
}

#[test]
fn shipped_config_loads_with_every_section() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let c = Config::load(&path, &Overrides::default()).unwrap();
    assert!(c.socket.path.ends_with("out/hsx.sock"));
    assert_eq!(c.socket.mode, 0o600);
    assert_eq!(c.http.unwrap().address, "127.0.0.1:8000");
    assert!(c.metrics.enabled);
}

#[test]
fn layer_list_parses() {
    assert_eq!(parse_layer_list("0, 2,5").unwrap(), vec![0, 2, 5]);
    assert!(parse_layer_list("1,x").is_err());
}

#[test]
fn device_choices_parse() {
    assert_eq!(DeviceChoice::parse("cpu").unwrap(), DeviceChoice::Cpu);
    assert_eq!(DeviceChoice::parse("cuda").unwrap(), DeviceChoice::Cuda(0));
    assert_eq!(
        DeviceChoice::parse("cuda:3").unwrap(),
        DeviceChoice::Cuda(3)
    );
    assert_eq!(DeviceChoice::parse("auto").unwrap(), DeviceChoice::Auto);
    for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU"] {
        let e = DeviceChoice::parse(bad).unwrap_err().to_string();
        assert!(e.contains("cuda:N"), "{bad}: {e}");
    }
}

#[test]
fn chat_render_limits_parse_and_validate() {
    let c = Config::parse(MINIMAL).unwrap();
    assert_eq!(c.chat.render_limits(), crate::chat::RenderLimits::default());
    let text = "[model]\npath = \"m\"\n[chat]\nmax_render_fuel = 1000\nmax_render_bytes = 4096\n";
    let c = Config::parse(text).unwrap();
    c.validate().unwrap();
    let l = c.chat.render_limits();
    assert_eq!((l.max_fuel, l.max_bytes), (1000, 4096));
    let err = Config::parse("[model]\npath = \"m\"\n[chat]\nmax_fuel = 1\n").unwrap_err();
    assert!(err.to_string().contains("max_fuel"), "{err}");
    for key in ["max_render_fuel", "max_render_bytes"] {
        let c = Config::parse(&format!("{MINIMAL}[chat]\n{key} = 0\n")).unwrap();
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains(&format!("chat.{key}")), "{e}");
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config.toml");
    let c = Config::load(&path, &Overrides::default()).unwrap();
    assert_eq!(c.chat.render_limits(), crate::chat::RenderLimits::default());
}
