//! Reliability: SIGKILL mid-run, disk-full and step faults, hostile input (proptest), long-held connections.
//!
//! One test binary per area (each links the whole crate once).

#[path = "../common/mod.rs"]
mod common;
#[path = "../soak/crash.rs"]
mod crash;
#[path = "../daemon_support/mod.rs"]
mod daemon_support;
#[path = "../soak/fuzz.rs"]
mod fuzz;
#[path = "../soak/model_dirs.rs"]
mod model_dirs;

mod conns;
mod crash_kill;
mod faults;
mod fuzz_inputs_run;
mod hostile_models;
