//! connector actor.
