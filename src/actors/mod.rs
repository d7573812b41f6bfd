//! The engine's actors (DESIGN.md §2): scheduler, block manager, model runner, connector and
//! event hub. Each keeps its logic in a plain state struct tested without channels; the actor
//! wrapper only moves messages.

pub mod block_manager;
pub mod chunk_bytes;
pub mod connector;
pub mod events;
pub mod messages;
pub mod model_runner;
pub mod scheduler;
