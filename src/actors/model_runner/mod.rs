//! model_runner actor.
