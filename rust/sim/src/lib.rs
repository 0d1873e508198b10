//! Tests only: see `tests/simulation.rs`.
