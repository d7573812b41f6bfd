//! events actor.
