//! Typed config.toml.
