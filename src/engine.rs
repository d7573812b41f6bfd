//! Wires the actors together into a running engine.
