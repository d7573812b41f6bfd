//! scheduler actor.
