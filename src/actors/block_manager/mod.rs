//! block_manager actor.
