//! The embedded engine and `hsx extract`: CLI, datasets, fan-out, fp8 files, memory bound, chat templates, chunked prefill, hybrid end to end, CUDA device selection.
//!
//! One test binary per area (each links the whole crate once).

#[path = "../common/mod.rs"]
mod common;

mod bad_states;
mod chat_limits;
mod chat_templates;
mod chunking;
mod cli;
mod cuda_device;
mod dataset;
mod fanout;
mod fp8;
mod hybrid_e2e;
mod memory_bound;
