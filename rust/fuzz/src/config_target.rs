//! The sink configuration (JSON from the Java builders, decoded by the JNI
//! bridge at build time and again on every task manager). It crosses a
//! process boundary and may be edited by hand in a SQL `WITH` clause, so
//! any bytes must give a `ConfigError`, never a panic.

use std::fmt::Write as _;

use twopc_jni::config::SinkConfig;

use crate::gen::token;
use crate::mutate::{mutate, Framing, Mutated};
use crate::rng::Rng;
use crate::targets::{Stage, Target};

pub struct ConfigTarget;

impl Target for ConfigTarget {
    fn name(&self) -> &'static str {
        "sink-config"
    }

    fn generate(&self, seed: u64) -> Mutated {
        let mut rng = Rng::for_input(self.name(), seed);
        let valid = config(&mut rng).into_bytes();
        mutate(&mut rng, Framing::Bytes, valid, &|r| config(r).into_bytes())
    }

    fn check(&self, bytes: &[u8], valid: bool) -> Stage {
        let stage = match std::str::from_utf8(bytes) {
            Err(_) => Stage::Framing,
            Ok(text) => match SinkConfig::decode(text) {
                Ok(config) => {
                    // Decoding is a function of the text alone.
                    let again = SinkConfig::decode(text).expect("accepted once, refused again");
                    assert_eq!(format!("{config:?}"), format!("{again:?}"));
                    Stage::Accepted
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty(), "a refusal says why");
                    if serde_json::from_str::<serde_json::Value>(text).is_err() {
                        Stage::Decode
                    } else {
                        Stage::Validate
                    }
                }
            },
        };
        assert!(
            !valid || stage == Stage::Accepted,
            "sink-config: a valid configuration was refused ({stage:?}): {}",
            String::from_utf8_lossy(bytes)
        );
        stage
    }

    fn must_reach(&self) -> &'static [Stage] {
        &Stage::ALL
    }

    fn framing(&self) -> Framing {
        Framing::Bytes
    }
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialise")
}

/// A valid configuration as the Java builders write it, with optional
/// fields sometimes left out.
pub fn config(rng: &mut Rng) -> String {
    let interval = if rng.percent(30) {
        0
    } else {
        rng.range(1, 60_000)
    };
    let replace_range = rng.percent(50);
    let mut sink = format!(
        "\"sinkId\":{},\"instance\":\"{:016x}\",\"retentionMs\":{},\"restartAllowanceMs\":{},\
         \"checkpointIntervalMs\":{interval},\"rewindPolicy\":\"{}\",\"freshStartPolicy\":\"{}\",\
         \"commitMaxAttempts\":{},\"commitInitialBackoffMs\":100,\"commitMaxBackoffMs\":{}",
        quoted(&token(rng, 64)),
        rng.next_u64(),
        7 * 24 * 3_600_000u64 + rng.below(1_000_000),
        rng.range(0, 600_000),
        if replace_range {
            "REPLACE_RANGE"
        } else {
            "FAIL"
        },
        rng.pick(&[
            "FAIL",
            "ABORT_PREPARED",
            "APPEND",
            "APPEND_AND_ABORT_PREPARED"
        ]),
        rng.range(1, 100),
        rng.range(100, 600_000),
    );
    for field in ["ownerWaitMs", "lineageWaitMs", "expiryScanIntervalMs"] {
        if rng.percent(50) {
            let _ = write!(sink, ",\"{field}\":{}", rng.range(0, 1_000_000));
        }
    }
    let destination = if rng.percent(60) {
        format!(
            "{{\"type\":\"filesystem\",\"path\":{},\"partPrefix\":{},\"partSuffix\":{},\
             \"recordFormat\":\"{}\",\"ioMode\":\"{}\"}}",
            quoted(&format!("/{}/{}", token(rng, 12), token(rng, 12))),
            quoted(&token(rng, 32)),
            quoted(&if rng.percent(50) {
                String::new()
            } else {
                format!(".{}", token(rng, 16))
            }),
            rng.pick(&["LINES", "RAW"]),
            rng.pick(&["AUTO", "DIRECT", "BUFFERED"]),
        )
    } else {
        let connection = if rng.percent(50) {
            format!(
                "\"url\":{}",
                quoted(&format!(
                    "postgres://{}@{}:5432/{}",
                    token(rng, 8),
                    token(rng, 8),
                    token(rng, 8)
                ))
            )
        } else {
            format!(
                "\"host\":{},\"port\":{},\"database\":{},\"user\":{}",
                quoted(&token(rng, 12)),
                rng.range(1, 65_535),
                quoted(&token(rng, 12)),
                quoted(&token(rng, 12)),
            )
        };
        let idempotent = !replace_range && rng.percent(40);
        format!(
            "{{\"type\":\"postgres\",{connection},\"passwordSource\":\"{}\",\
             \"table\":\"public.t\",\"columns\":[\"id\",\"body\"],\"mode\":\"{}\",\
             \"keyColumns\":{}{},\"copyFormat\":\"{}\",{}\
             \"controlSchema\":\"public\",\"connectTimeoutMs\":{}}}",
            // The SQL connector's 'password' option, or where a task
            // manager reads one.
            rng.pick(&["env:PGPASSWORD", "property:pg.password", "option:password"]),
            if idempotent {
                "IDEMPOTENT"
            } else {
                "TRANSACTIONAL"
            },
            if idempotent { "[\"id\"]" } else { "[]" },
            // Deletes by key (the SQL connector's upsert tables): idempotent
            // mode only.
            if idempotent && rng.percent(50) {
                ",\"operationField\":true"
            } else {
                ""
            },
            rng.pick(&["TEXT", "CSV"]),
            // REPLACE_RANGE needs it; idempotent mode refuses it (a replay
            // overwrites by key there).
            if idempotent {
                ""
            } else {
                "\"transactionIdColumn\":\"txn\","
            },
            rng.range(1, 60_000),
        )
    };
    format!("{{\"version\":1,\"sink\":{{{sink}}},\"destination\":{destination}}}")
}
