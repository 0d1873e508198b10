//! The names that destinations writing files or objects give a
//! transaction's visible output and its commit record, and the checks that
//! names read back are exactly such names.
//!
//! The filesystem and the object-store destinations share them so that a
//! bucket's keys mirror a directory's files (a reader, `twopc inspect` and
//! an operator see the same names in both) and so that both refuse a
//! forged name the same way: a name read back from a record or a listing
//! must never make a sink publish, delete or report anything but the
//! transaction it names.

use crate::error::ConfigError;
use crate::ids::{validate_token, CheckpointId, LineageId, TransactionId};

/// Longest part prefix accepted.
pub const MAX_PREFIX_LEN: usize = 32;
/// Longest part suffix accepted, without its dot.
pub const MAX_SUFFIX_LEN: usize = 16;

/// Checks a configured part prefix (a token) and suffix (empty, or a dot
/// and a token), so that every name [`part_name`] makes passes
/// [`check_part_name`].
pub fn validate_part_affixes(prefix: &str, suffix: &str) -> Result<(), ConfigError> {
    validate_token("part prefix", prefix, MAX_PREFIX_LEN)?;
    if !suffix.is_empty() {
        let rest = suffix.strip_prefix('.').ok_or_else(|| {
            ConfigError::new(format!(
                "part suffix {suffix:?} must start with '.', e.g. \".txt\""
            ))
        })?;
        validate_token("part suffix", rest, MAX_SUFFIX_LEN)?;
    }
    Ok(())
}

/// The visible name of `txn`'s output, `<prefix>-<txn><suffix>`:
/// deterministic, so that a repeated commit publishes to the same name.
pub fn part_name(prefix: &str, txn: &TransactionId, suffix: &str) -> String {
    format!("{prefix}-{txn}{suffix}")
}

/// Checks that `name` (one path component or key name, already split from
/// its directory or prefix by the caller) is a name [`part_name`] could
/// have given `txn`'s output: a valid prefix, `-<txn>`, and an empty or
/// valid suffix. Not necessarily with today's prefix and suffix: the
/// options may have changed since the transaction was prepared.
/// `described` names it in the error, e.g. `output file name "x"`.
pub fn check_part_name(name: &str, txn: &TransactionId, described: &str) -> Result<(), String> {
    let marker = format!("-{txn}");
    let Some(at) = name.find(&marker) else {
        return Err(format!("{described} does not name transaction {txn}"));
    };
    let (prefix, suffix) = (&name[..at], &name[at + marker.len()..]);
    validate_token("part prefix", prefix, MAX_PREFIX_LEN)
        .map_err(|e| format!("{described}: {}", e.message()))?;
    if !suffix.is_empty() {
        let rest = suffix
            .strip_prefix('.')
            .ok_or_else(|| format!("{described} has a suffix that does not start with '.'"))?;
        validate_token("part suffix", rest, MAX_SUFFIX_LEN)
            .map_err(|e| format!("{described}: {}", e.message()))?;
    }
    Ok(())
}

/// The name of the commit record of `txn`, committed for `checkpoint` of
/// `lineage`: `<lineage>-<checkpoint>-<txn>`, so that a listing sorts and
/// filters records by lineage without reading them.
pub fn commit_record_name(
    lineage: LineageId,
    checkpoint: CheckpointId,
    txn: &TransactionId,
) -> String {
    format!("{lineage}-{checkpoint}-{txn}")
}

/// Parses a commit record name into (lineage, checkpoint, transaction);
/// `None` for anything that is not exactly such a name (one record, one
/// name: no `+1`, no leading zeros, no short lineage).
pub fn parse_commit_record_name(name: &str) -> Option<(LineageId, CheckpointId, TransactionId)> {
    let (lineage, rest) = name.split_once('-')?;
    let (checkpoint, txn) = rest.split_once('-')?;
    let lineage = LineageId::parse(lineage)?;
    let checkpoint: CheckpointId = checkpoint.parse().ok()?;
    let txn = TransactionId::parse(txn)?.id;
    (commit_record_name(lineage, checkpoint, &txn) == name).then_some((lineage, checkpoint, txn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::SinkId;

    fn txn(seq: u64) -> TransactionId {
        TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, seq)
    }

    #[test]
    fn part_names_are_checked_against_their_transaction() {
        let t = txn(2);
        for (prefix, suffix) in [("part", ""), ("out", ".csv"), ("p-1", ".json")] {
            validate_part_affixes(prefix, suffix).unwrap();
            let name = part_name(prefix, &t, suffix);
            assert!(check_part_name(&name, &t, "name").is_ok(), "{name}");
        }
        for bad in [
            format!("/etc/passwd-{t}"),
            format!("../part-{t}"),
            format!("a/part-{t}"),
            format!(".part-{t}"),
            format!("part-{t}.c/sv"),
            format!("part-{t}csv"),
            format!("part-{t}.{}", "x".repeat(MAX_SUFFIX_LEN + 1)),
            format!("{}-{t}", "p".repeat(MAX_PREFIX_LEN + 1)),
            format!("part-{}", txn(3)),
            "/etc/passwd".to_string(),
            String::new(),
        ] {
            let err = check_part_name(&bad, &t, "output file name \"n\"").unwrap_err();
            assert!(err.starts_with("output file name \"n\""), "{err}");
        }
    }

    #[test]
    fn configured_affixes_are_validated() {
        for (prefix, suffix) in [
            ("", ""),
            ("-part", ""),
            ("a/b", ""),
            ("part", "txt"),
            ("part", "."),
            ("part", ".t/x"),
        ] {
            assert!(
                validate_part_affixes(prefix, suffix).is_err(),
                "{prefix:?} {suffix:?}"
            );
        }
    }

    #[test]
    fn commit_record_names_round_trip_and_reject_variants() {
        let t = txn(2);
        let name = commit_record_name(LineageId(7), 12, &t);
        assert_eq!(
            parse_commit_record_name(&name),
            Some((LineageId(7), 12, t.clone()))
        );
        for bad in [
            format!("0000000000000007-+12-{t}"),
            format!("0000000000000007-012-{t}"),
            format!("000000000000007-12-{t}"),
            format!("zz00000000000007-12-{t}"),
            format!("000000000000000A-12-{t}"),
            "x".to_string(),
        ] {
            assert_eq!(parse_commit_record_name(&bad), None, "{bad:?}");
        }
    }
}
