//! Names the filesystem destination gives things, and the checks that
//! names read back from the disk are exactly such names.

use twopc_core::ids::{LineageId, TransactionId};

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
/// Tombstones of retracted commits (a rewind under REPLACE_RANGE, `twopc
/// reconcile`), written before the output is removed and kept.
pub(crate) const RETRACTED: &str = "retracted";
pub(crate) const OPERATIONS: &str = "operations";
pub(crate) const HISTORY: &str = "history";
/// Lock file (in `_twopc/<sink>/`) held while the history is rewritten.
pub(crate) const HISTORY_LOCK: &str = "history.lock";

/// Files inside a transaction's directory.
pub(crate) const DATA_FILE: &str = "data";
pub(crate) const PREPARED_FILE: &str = "prepared";

pub use twopc_core::part_names::{commit_record_name, parse_commit_record_name, part_name};

/// Checks that `file`, read back from a commit record of `txn`, is a name
/// this destination could have given `txn`'s output: one path component,
/// `<prefix>-<txn><suffix>` with a valid prefix and an empty or valid
/// suffix. A forged record must never make the sink delete or publish
/// anything else (an absolute path, `../x`, another transaction's file).
pub fn check_part_name(file: &str, txn: &TransactionId) -> Result<(), String> {
    twopc_core::part_names::check_part_name(file, txn, &format!("output file name {file:?}"))
}

/// Name of a lineage record.
pub(crate) fn lineage_record_name(lineage: LineageId) -> String {
    lineage.to_string()
}

/// Parses a lineage record name.
pub(crate) fn parse_lineage_record_name(name: &str) -> Option<LineageId> {
    LineageId::parse(name)
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
    fn forged_file_names_are_refused_and_named_in_the_error() {
        let t = txn();
        assert!(check_part_name(&part_name("out", &t, ".csv"), &t).is_ok());
        let err = check_part_name(&format!("../part-{t}"), &t).unwrap_err();
        assert!(
            err.starts_with(&format!("output file name \"../part-{t}\"")),
            "{err}"
        );
    }

    #[test]
    fn lineage_record_names_round_trip() {
        let l = LineageId(0x9c1e_0f3a_5b7d_2e41);
        assert_eq!(parse_lineage_record_name(&lineage_record_name(l)), Some(l));
        assert_eq!(parse_lineage_record_name("9C1E0F3A5B7D2E41"), None);
        assert_eq!(parse_lineage_record_name("1"), None);
    }

    #[test]
    fn trash_names_name_their_transaction() {
        let t = txn();
        assert_eq!(parse_trash_name(&trash_name(&t)), Some(t));
        assert_eq!(parse_trash_name("nonsense.0000000000000000"), None);
    }
}
