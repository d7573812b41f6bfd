//! `hsx serve` end to end: the Unix socket, HTTP (OpenAI subset + chat), metrics and the CLI clients against a real daemon on a temp socket.
//!
//! One test binary per area (each links the whole crate once).

#[path = "../common/mod.rs"]
mod common;
#[path = "../daemon_support/mod.rs"]
mod daemon_support;

mod bad_states;
mod chat;
mod cli;
mod http;
mod metrics;
mod prefix;
mod socket;
