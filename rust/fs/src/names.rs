//! Names the filesystem destination gives things, and the checks that
//! names read back from the disk are exactly such names.

use twopc_core::ids::{validate_token, CheckpointId, LineageId, TransactionId};

/// Directory (under the output directory) holding everything not visible.
pub const CONTROL_DIR: &str = "_twopc";

/// Subdirectories of `_twopc/<sink>/`.
pub(crate) const STAGING: &str = "staging";
pub(crate) const COMMITTING: &str = "committing";
pub(crate) const COMMITTED: &str = "committed";
pub(crate) const EXPIRED: &str = "expired";
pub(crate) const TRASH: &str = "trash";
pub(crate) const TMP: &str = "tmp";
pub(crate) const OWNERS: &str = "owners";
pub(crate) const LINEAGES: &str = "lineages";
pub(crate) const RUNS: &str = "runs";
pub(crate) const LOST: &str = "lost";
pub(crate) const OPERATIONS: &str = "operations";
pub(crate) const HISTORY: &str = "history";
/// Lock file (in `_twopc/<sink>/`) held while the history is rewritten.
pub(crate) const HISTORY_LOCK: &str = "history.lock";

/// Files inside a transaction's directory.
pub(crate) const DATA_FILE: &str = "data";
pub(crate) const PREPARED_FILE: &str = "prepared";

/// Longest part prefix and suffix (without its dot) accepted.
pub(crate) const MAX_PREFIX_LEN: usize = 32;
pub(crate) const MAX_SUFFIX_LEN: usize = 16;

/// Visible file name of a transaction: deterministic, so a repeated commit
/// publishes to the same name.
pub fn part_name(prefix: &str, txn: &TransactionId, suffix: &str) -> String {
    format!("{prefix}-{txn}{suffix}")
}

/// Checks that `file`, read back from a commit record of `txn`, is a name
/// this destination could have given `txn`'s output: one path component,
/// `<prefix>-<txn><suffix>` with a valid prefix and an empty or valid
/// suffix. A forged record must never make the sink delete or publish
/// anything else (an absolute path, `../x`, another transaction's file).
pub fn check_part_name(file: &str, txn: &TransactionId) -> Result<(), String> {
    let marker = format!("-{txn}");
    let Some(at) = file.find(&marker) else {
        return Err(format!(
            "output file name {file:?} does not name transaction {txn}"
        ));
    };
    let prefix = &file[..at];
    let suffix = &file[at + marker.len()..];
    validate_token("part prefix", prefix, MAX_PREFIX_LEN)
        .map_err(|e| format!("output file name {file:?}: {}", e.message()))?;
    if !suffix.is_empty() {
        let rest = suffix.strip_prefix('.').ok_or_else(|| {
            format!("output file name {file:?} has a suffix that does not start with '.'")
        })?;
        validate_token("part suffix", rest, MAX_SUFFIX_LEN)
            .map_err(|e| format!("output file name {file:?}: {}", e.message()))?;
    }
    Ok(())
}

/// Name of the commit record of `txn`, committed for `checkpoint` of
/// `lineage`.
pub fn commit_record_name(
    lineage: LineageId,
    checkpoint: CheckpointId,
    txn: &TransactionId,
) -> String {
    format!("{lineage}-{checkpoint}-{txn}")
}

/// Parses a commit record name into (lineage, checkpoint, transaction);
/// `None` for anything that is not exactly such a name.
pub fn parse_commit_record_name(name: &str) -> Option<(LineageId, CheckpointId, TransactionId)> {
    let (lineage, rest) = name.split_once('-')?;
    let (checkpoint, txn) = rest.split_once('-')?;
    if lineage.len() != 16 || !lineage.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let lineage = LineageId(u64::from_str_radix(lineage, 16).ok()?);
    let checkpoint: CheckpointId = checkpoint.parse().ok()?;
    let txn = TransactionId::parse(txn)?.id;
    // One record, one name: no "+1" or leading zeros.
    (commit_record_name(lineage, checkpoint, &txn) == name).then_some((lineage, checkpoint, txn))
}

/// Name of a lineage record.
pub(crate) fn lineage_record_name(lineage: LineageId) -> String {
    lineage.to_string()
}

/// Parses a lineage record name.
pub(crate) fn parse_lineage_record_name(name: &str) -> Option<LineageId> {
    if name.len() != 16 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let l = LineageId(u64::from_str_radix(name, 16).ok()?);
    (lineage_record_name(l) == name).then_some(l)
}

/// Name of a claimed-for-removal entry in the trash: the transaction id and
/// a nonce (two removals of one id never collide).
pub(crate) fn trash_name(txn: &TransactionId) -> String {
    format!("{txn}.{:016x}", twopc_core::ids::random_u64())
}

/// The transaction a trash entry held.
pub(crate) fn parse_trash_name(name: &str) -> Option<TransactionId> {
    let (txn, nonce) = name.rsplit_once('.')?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    TransactionId::parse(txn).map(|p| p.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::ids::SinkId;

    fn txn() -> TransactionId {
        TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, 2)
    }

    #[test]
    fn part_names_are_checked_against_the_transaction() {
        let t = txn();
        assert!(check_part_name(&part_name("part", &t, ""), &t).is_ok());
        assert!(check_part_name(&part_name("out", &t, ".csv"), &t).is_ok());
        let other = TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, 3);
        for bad in [
            format!("/etc/passwd-{t}"),
            format!("../part-{t}"),
            format!("a/part-{t}"),
            format!(".part-{t}"),
            format!("part-{t}.c/sv"),
            format!("part-{t}csv"),
            format!("part-{other}"),
            "/etc/passwd".to_string(),
            String::new(),
        ] {
            assert!(check_part_name(&bad, &t).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn commit_record_names_round_trip_and_reject_variants() {
        let t = txn();
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
            "x".to_string(),
        ] {
            assert_eq!(parse_commit_record_name(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn trash_names_name_their_transaction() {
        let t = txn();
        assert_eq!(parse_trash_name(&trash_name(&t)), Some(t));
        assert_eq!(parse_trash_name("nonsense.0000000000000000"), None);
    }
}
