//! twopc-fuzz: a standing fuzz check of every decoder that reads checkpoint
//! state or destination files, on stable Rust.
//!
//! Inputs come from a seeded, deterministic generator ([`rng`]): valid
//! values built with the crates' own constructors and encoders ([`gen`]),
//! then mutated with knowledge of their framing ([`mutate`]), so that most
//! inputs get past length fields and checksums into the decoder proper.
//! Each target ([`targets::TARGETS`]) pairs a decoder with its encoder and
//! states the properties checked on every input. The runner ([`runner`])
//! catches panics, hangs (watchdog) and, with the test binary's allocator,
//! allocations over 64 MiB, and names the target and seed of each failure
//! so it can be replayed.
//!
//! The test `tests/fuzz.rs` runs it (100,000 inputs per target by
//! default); `scripts/fuzz.sh` runs 10^7 per target in release.
#![forbid(unsafe_code)]

pub mod cli;
pub mod config_target;
pub mod gen;
pub mod mutate;
pub mod report;
pub mod rng;
pub mod runner;
pub mod selftest;
pub mod targets;
