//! Decoders that misbehave on purpose, one per kind of failure, so each
//! detector is shown to fire: a harness whose hang check or allocation
//! limit silently stopped working would otherwise pass forever. The test
//! binary runs each in a child process (hangs and allocations abort) and
//! checks that it failed with the right report.

use crate::mutate::{Framing, Mutated};
use crate::targets::{Stage, Target};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Misbehaviour {
    Panic,
    Hang,
    Allocate,
}

pub struct Misbehaving {
    name: &'static str,
    what: Misbehaviour,
}

impl Target for Misbehaving {
    fn name(&self) -> &'static str {
        self.name
    }

    fn generate(&self, seed: u64) -> Mutated {
        Mutated {
            bytes: seed.to_be_bytes().to_vec(),
            valid: false,
        }
    }

    fn check(&self, bytes: &[u8], _valid: bool) -> Stage {
        match self.what {
            Misbehaviour::Panic => panic!("self-test decoder panics on {} bytes", bytes.len()),
            Misbehaviour::Hang => loop {
                std::thread::sleep(std::time::Duration::from_millis(5));
                std::hint::black_box(bytes);
            },
            Misbehaviour::Allocate => {
                // One byte over the limit, as a decoder trusting a forged
                // length would ask for it.
                let v: Vec<u8> = Vec::with_capacity(crate::runner::ALLOCATION_LIMIT + 1);
                std::hint::black_box(&v);
                Stage::Accepted
            }
        }
    }

    fn must_reach(&self) -> &'static [Stage] {
        &[]
    }

    fn framing(&self) -> Framing {
        Framing::Bytes
    }
}

/// Not part of [`crate::targets::TARGETS`]: run only by `--self-test`.
pub static SELF_TESTS: &[&dyn Target] = &[
    &Misbehaving {
        name: "selftest-panic",
        what: Misbehaviour::Panic,
    },
    &Misbehaving {
        name: "selftest-hang",
        what: Misbehaviour::Hang,
    },
    &Misbehaving {
        name: "selftest-allocate",
        what: Misbehaviour::Allocate,
    },
];
