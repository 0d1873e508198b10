//! The keys the destination gives objects in the bucket, and the checks
//! that keys read back (from a listing, a control object, a handle) are
//! exactly such keys.

use twopc_core::ids::{CheckpointId, LineageId, SinkId, TransactionId};
use twopc_core::part_names::part_name;
pub use twopc_core::part_names::{commit_record_name, parse_commit_record_name};

/// The control area under the prefix (names starting with `_` are skipped
/// by Flink's and Hadoop's readers, as in the filesystem destination).
pub const CONTROL_DIR: &str = "_twopc";

pub const PREPARED: &str = "prepared";
pub const COMMITTED: &str = "committed";
pub const EXPIRED: &str = "expired";
/// Tombstones of retractions (see `ObjectStoreDestination::retract`).
pub const RETRACTED: &str = "retracted";
pub const OWNERS: &str = "owners";
pub const LINEAGES: &str = "lineages";
pub const RUNS: &str = "runs";
pub const LOST: &str = "lost";
pub const OPERATIONS: &str = "operations";
/// Short-lived objects of the start-up check of conditional writes (see
/// `ObjectStoreDestination::check_conditional_writes`).
pub const PROBES: &str = "probes";
/// Folded commit records (see `history`).
pub const HISTORY: &str = "history";
/// The list of live history segments, replaced with If-Match (see
/// `history`); beside the area, not in it.
pub const HISTORY_INDEX: &str = "history.index";

/// The keys of one sink under one bucket prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub bucket: String,
    /// Without a trailing `/`; empty for the bucket's root.
    pub prefix: String,
    pub sink: SinkId,
    pub part_prefix: String,
    pub part_suffix: String,
}

impl Layout {
    fn under_prefix(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_string()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    /// The visible object of a transaction: `prefix/<part-prefix>-<txn><suffix>`,
    /// named as the filesystem destination names its files.
    pub fn part_key(&self, txn: &TransactionId) -> String {
        self.under_prefix(&part_name(&self.part_prefix, txn, &self.part_suffix))
    }

    /// The start of every visible object key of this sink (for listing its
    /// multipart uploads).
    pub fn parts_of_sink(&self) -> String {
        self.under_prefix(&format!("{}-{}.", self.part_prefix, self.sink))
    }

    /// `prefix/_twopc/<sink>/<area>/`.
    pub fn area(&self, area: &str) -> String {
        self.under_prefix(&format!("{CONTROL_DIR}/{}/{area}/", self.sink))
    }

    pub fn control(&self, area: &str, name: &str) -> String {
        format!("{}{name}", self.area(area))
    }

    /// `prefix/_twopc/<sink>/history.index`.
    pub fn history_index(&self) -> String {
        self.under_prefix(&format!("{CONTROL_DIR}/{}/{HISTORY_INDEX}", self.sink))
    }

    pub fn commit_record_key(
        &self,
        lineage: LineageId,
        checkpoint: CheckpointId,
        txn: &TransactionId,
    ) -> String {
        self.control(COMMITTED, &commit_record_name(lineage, checkpoint, txn))
    }

    /// The transaction whose visible object `key` is, if `key` is one of
    /// this sink's (with this layout's part prefix and suffix).
    pub fn txn_of_part_key(&self, key: &str) -> Option<TransactionId> {
        let name = key.strip_prefix(&self.under_prefix(""))?;
        let name = name.strip_prefix(&format!("{}-", self.part_prefix))?;
        let txn = name.strip_suffix(self.part_suffix.as_str())?;
        let parsed = TransactionId::parse(txn)?;
        (parsed.sink == self.sink && self.part_key(&parsed.id) == key).then_some(parsed.id)
    }

    /// Checks that `key`, read back from a handle or a record of `txn`, is
    /// a key this sink could have given `txn`'s output: under this prefix,
    /// one name `<prefix>-<txn><suffix>` with a valid prefix and suffix (not
    /// necessarily today's options: they may have changed since). A forged
    /// record must never make the sink complete, delete or report anything
    /// else.
    pub fn check_part_key(&self, key: &str, txn: &TransactionId) -> Result<(), String> {
        let Some(name) = key.strip_prefix(&self.under_prefix("")) else {
            return Err(format!(
                "object key {key:?} is not under the prefix {:?}",
                self.prefix
            ));
        };
        if name.contains('/') {
            return Err(format!(
                "object key {key:?} is not directly under the prefix"
            ));
        }
        twopc_core::part_names::check_part_name(name, txn, &format!("object key {key:?}"))
    }

    /// Whether `key`, a part key of `txn` under some part prefix, could as
    /// well be another sink's part key: sink ids may hold '-', so
    /// `part-x-s.1.N.2` is sink `s`'s name with the part prefix `part-x`
    /// and sink `x-s`'s with `part`. Only today's names are this sink's
    /// for sure; a name from an earlier configuration that reads as
    /// another sink's must not be acted on.
    pub fn could_be_another_sinks(&self, key: &str, txn: &TransactionId) -> bool {
        self.other_readings(key, txn)
            .is_none_or(|others| !others.is_empty())
    }

    /// The transactions of other sinks that `key` (a part key of `txn`)
    /// could as well be (see [`Layout::could_be_another_sinks`]); `None`
    /// when `key` is not under the prefix or does not hold `txn`.
    pub fn other_readings(&self, key: &str, txn: &TransactionId) -> Option<Vec<TransactionId>> {
        let name = key.strip_prefix(&self.under_prefix(""))?;
        let start = name.find(txn.as_str())?;
        let end = start + txn.as_str().len();
        // Every '-' before ours could start another sink's transaction id
        // that ends where ours does: one in the earlier part prefix, and
        // one inside this sink's own id (`part-a-b.…` is sink `a-b`'s under
        // `part` and sink `b`'s under `part-a`). Ours starts right after
        // the separator.
        Some(
            name[..end]
                .char_indices()
                .filter(|&(at, c)| c == '-' && at + 1 != start)
                .filter_map(|(at, _)| TransactionId::parse(&name[at + 1..end]))
                .filter(|other| other.sink != self.sink)
                .map(|other| other.id)
                .collect(),
        )
    }

    /// `prefix/_twopc/<sink>/`: where a sink of this prefix keeps its
    /// control objects.
    pub fn control_area_of(&self, sink: &SinkId) -> String {
        self.under_prefix(&format!("{CONTROL_DIR}/{sink}/"))
    }

    /// The prepare marker another sink of this prefix writes for its
    /// transaction `txn` (whose id names that sink).
    pub fn marker_of_other_sink(&self, txn: &TransactionId) -> Option<String> {
        let parsed = TransactionId::parse(txn.as_str())?;
        Some(format!(
            "{}{PREPARED}/{txn}",
            self.control_area_of(&parsed.sink)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(prefix: &str) -> Layout {
        Layout {
            bucket: "b".into(),
            prefix: prefix.into(),
            sink: SinkId::new("s").unwrap(),
            part_prefix: "part".into(),
            part_suffix: ".txt".into(),
        }
    }

    #[test]
    fn part_keys_round_trip_and_forged_ones_are_refused() {
        let sink = SinkId::new("s").unwrap();
        let t = TransactionId::compose(&sink, 1, 0xab, 2);
        for l in [layout(""), layout("out/x")] {
            let key = l.part_key(&t);
            assert_eq!(l.txn_of_part_key(&key), Some(t.clone()));
            assert!(key.starts_with(&l.parts_of_sink()));
            assert!(l.check_part_key(&key, &t).is_ok());
            let other = TransactionId::compose(&sink, 1, 0xab, 3);
            for bad in [
                l.part_key(&other),
                format!("elsewhere/part-{t}"),
                key.replace("part-", "a/part-"),
                key.replace(".txt", "txt"),
                l.control(PREPARED, t.as_str()),
            ] {
                assert!(l.check_part_key(&bad, &t).is_err(), "{bad:?} accepted");
            }
        }
        assert_eq!(layout("p").txn_of_part_key("p/part-x.txt"), None);
        assert_eq!(
            layout("p").control(COMMITTED, "n"),
            "p/_twopc/s/committed/n"
        );
    }

    #[test]
    fn an_earlier_name_that_reads_as_another_sinks_is_told_apart() {
        let l = layout("out");
        let t = TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, 2);
        // Today's name and earlier prefixes or suffixes without a '-'.
        assert!(!l.could_be_another_sinks(&l.part_key(&t), &t));
        assert!(!l.could_be_another_sinks(&format!("out/data-{t}.csv"), &t));
        // `part-x-<t>` is also sink `x-s`'s part name under prefix `part`.
        assert!(l.could_be_another_sinks(&format!("out/part-x-{t}.txt"), &t));
        // Any '-' in an earlier part prefix can start another sink's id.
        assert!(l.could_be_another_sinks(&format!("out/my-part-{t}"), &t));
        assert!(l.could_be_another_sinks(&format!("elsewhere/part-{t}"), &t));
        // A '-' in this sink's own id: `part-a-b.…` is also sink `b`'s
        // name under the part prefix `part-a` (found by review).
        let mut dashed = layout("out");
        dashed.sink = SinkId::new("a-b").unwrap();
        let t = TransactionId::compose(&dashed.sink, 1, 0xab, 2);
        assert!(dashed.could_be_another_sinks(&format!("out/part-{t}"), &t));
        assert!(dashed.could_be_another_sinks(&dashed.part_key(&t), &t));
        // The readings are named: today's key of sink `s` under `part-x`
        // is also sink `x-s`'s under `part`.
        let t = TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, 2);
        let under_dashed_prefix = Layout {
            part_prefix: "part-x".into(),
            ..layout("out")
        };
        let other = TransactionId::compose(&SinkId::new("x-s").unwrap(), 1, 0xab, 2);
        assert_eq!(
            under_dashed_prefix.other_readings(&under_dashed_prefix.part_key(&t), &t),
            Some(vec![other.clone()])
        );
        assert_eq!(l.other_readings(&l.part_key(&t), &t), Some(vec![]));
        assert_eq!(
            under_dashed_prefix.marker_of_other_sink(&other).unwrap(),
            format!("out/_twopc/x-s/prepared/{other}")
        );
    }

    #[test]
    fn commit_record_names_round_trip() {
        let t = TransactionId::compose(&SinkId::new("s").unwrap(), 1, 0xab, 2);
        let name = commit_record_name(LineageId(7), 12, &t);
        assert_eq!(
            parse_commit_record_name(&name),
            Some((LineageId(7), 12, t.clone()))
        );
        assert_eq!(
            parse_commit_record_name(&format!("0000000000000007-012-{t}")),
            None
        );
    }
}
