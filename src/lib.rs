//! hsx: run a causal language model over prompts and save the hidden states of chosen layers
//! to safetensors files (see DESIGN.md in the shared folder for the contracts).

pub mod actors;
pub mod chat;
pub mod chat_files;
pub mod config;
pub mod engine;
pub mod env_report;
pub mod extract;
pub mod faults;
pub mod inspect;
pub mod kernels;
pub mod models;
pub mod server;

/// The version written into every file's `__metadata__`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
