//! The retention check: a bucket lifecycle rule
//! `AbortIncompleteMultipartUpload` silently deletes prepared transactions
//! (their uploads are incomplete until the commit), which loses the output
//! of a checkpoint whose commit comes late, and makes savepoints
//! unrestorable. At open, the sink reads the bucket's lifecycle
//! configuration and refuses a rule that covers its uploads with fewer
//! days than it needs.

use crate::s3api::LifecycleRule;

const DAY_MS: u64 = 24 * 3600 * 1000;

/// How long a prepared upload must survive: two checkpoint intervals (a
/// transaction prepared at one checkpoint commits when the next completes,
/// and one may fail), the time a restart may take, and how long the user
/// keeps savepoints they may restore.
pub fn needed_retention_ms(
    checkpoint_interval_ms: u64,
    restart_allowance_ms: u64,
    savepoint_retention_ms: u64,
) -> u64 {
    checkpoint_interval_ms
        .saturating_mul(2)
        .saturating_add(restart_allowance_ms)
        .saturating_add(savepoint_retention_ms)
}

/// The first enabled rule that aborts incomplete uploads under
/// `uploads_prefix` (the start of every key this sink uploads to) sooner
/// than `needed_ms`, as a message naming the rule, its days and what to
/// set; `None` when no rule is in the way.
pub fn refusal(
    rules: &[LifecycleRule],
    bucket: &str,
    uploads_prefix: &str,
    needed_ms: u64,
) -> Option<String> {
    for rule in rules {
        let Some(days) = rule.abort_incomplete_days else {
            continue;
        };
        // A rule covers some of our uploads when one prefix starts the
        // other (`out/` covers `out/part-s.…`; `out/part-s.1` covers some).
        let covers =
            uploads_prefix.starts_with(&rule.prefix) || rule.prefix.starts_with(uploads_prefix);
        if !rule.enabled || rule.narrowed || !covers {
            continue;
        }
        if days.saturating_mul(DAY_MS) >= needed_ms {
            continue;
        }
        let needed_days = needed_ms.div_ceil(DAY_MS);
        return Some(format!(
            "bucket {bucket}: lifecycle rule {} aborts incomplete multipart uploads {days} day(s) \
             after they begin, and it covers this sink's uploads ({uploads_prefix}…), which stay \
             incomplete from prepare to commit. The sink needs them to live at least {} (two \
             checkpoint intervals, the restart allowance and the savepoint retention declared), \
             or a late commit or a restore finds its data gone. Set the rule's \
             DaysAfterInitiation to at least {needed_days}, narrow its prefix so that it does \
             not cover {uploads_prefix}, or declare a shorter savepoint retention",
            rule.id
                .as_deref()
                .map(|id| format!("'{id}'"))
                .unwrap_or_else(|| "(without an ID)".to_string()),
            twopc_core::timefmt::duration(needed_ms),
        ));
    }
    None
}

/// The first enabled rule that expires objects under the sink's control
/// area (`control_prefix`, `prefix/_twopc/<sink>/`), as a message naming
/// it: it would delete commit records, history segments and prepare
/// markers, after which a restore cannot tell what was committed (the
/// history then reads as damaged, and every restore stops). A rule
/// narrowed by tag is passed over (the sink tags nothing); one narrowed by
/// size is not: control objects are small and many size rules match them.
pub fn control_refusal(
    rules: &[LifecycleRule],
    bucket: &str,
    control_prefix: &str,
) -> Option<String> {
    let rule = rules.iter().find(|r| {
        r.enabled
            && !r.by_tag
            && (r.expires_objects || r.archives_objects)
            && (control_prefix.starts_with(&r.prefix) || r.prefix.starts_with(control_prefix))
    })?;
    let id = rule
        .id
        .as_deref()
        .map(|id| format!("'{id}'"))
        .unwrap_or_else(|| "(without an ID)".to_string());
    Some(if rule.expires_objects {
        format!(
            "bucket {bucket}: lifecycle rule {id} expires objects under {control_prefix}, where \
             the sink keeps its commit records, history and prepare markers. Once it deletes \
             them, a restore cannot tell what was committed and stops. Narrow the rule's prefix \
             (or filter) so that it does not cover {control_prefix}: expire the output objects \
             only"
        )
    } else {
        format!(
            "bucket {bucket}: lifecycle rule {id} moves objects under {control_prefix}, where \
             the sink keeps its commit records, history and prepare markers, to an archive \
             storage class (GLACIER or DEEP_ARCHIVE) that answers a GET only after a restore. \
             A restore of the job, or a rewind, reads them: it would stop. Narrow the rule's \
             prefix (or filter) so that it does not cover {control_prefix}, or transition to a \
             class that reads at once (GLACIER_IR)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(id: &str, prefix: &str, days: Option<u64>) -> LifecycleRule {
        LifecycleRule {
            id: Some(id.into()),
            enabled: true,
            prefix: prefix.into(),
            narrowed: false,
            abort_incomplete_days: days,
            expires_objects: false,
            archives_objects: false,
            by_tag: false,
        }
    }

    #[test]
    fn a_rule_expiring_the_control_area_is_refused_by_name() {
        let expiring = |id: &str, prefix: &str| LifecycleRule {
            expires_objects: true,
            ..rule(id, prefix, None)
        };
        let control = "out/_twopc/s/";
        let why = control_refusal(&[expiring("all", "out/")], "b", control).unwrap();
        assert!(why.contains("'all'") && why.contains(control), "{why}");
        assert!(control_refusal(&[expiring("whole", "")], "b", control).is_some());
        assert!(control_refusal(&[expiring("inside", "out/_twopc/")], "b", control).is_some());
        // Output only, another prefix, disabled, narrowed, or not expiring.
        assert!(control_refusal(&[expiring("parts", "out/part-")], "b", control).is_none());
        assert!(control_refusal(&[expiring("logs", "logs/")], "b", control).is_none());
        let mut off = expiring("off", "");
        off.enabled = false;
        let mut tagged = expiring("tagged", "");
        tagged.narrowed = true;
        tagged.by_tag = true;
        assert!(
            control_refusal(&[off, tagged, rule("abort", "", Some(30))], "b", control).is_none()
        );
        // Small objects only: the control objects are small.
        let mut small = expiring("small", "out/");
        small.narrowed = true;
        assert!(control_refusal(&[small], "b", control).is_some());
        // To an archive class that answers a GET only after a restore.
        let archiving = |id: &str, prefix: &str| LifecycleRule {
            archives_objects: true,
            ..rule(id, prefix, None)
        };
        let why = control_refusal(&[archiving("cold", "out/")], "b", control).unwrap();
        assert!(
            why.contains("'cold'") && why.contains("DEEP_ARCHIVE"),
            "{why}"
        );
        assert!(control_refusal(&[archiving("cold-parts", "out/part-")], "b", control).is_none());
    }

    #[test]
    fn a_short_rule_over_our_uploads_is_refused_by_name() {
        let needed = needed_retention_ms(3_600_000, 3_600_000, 3 * DAY_MS);
        let rules = [
            rule("elsewhere", "logs/", Some(1)),
            rule("long", "", Some(30)),
            rule("short", "out/", Some(2)),
        ];
        let why = refusal(&rules, "b", "out/part-s.", needed).unwrap();
        assert!(
            why.contains("'short'") && why.contains("2 day") && why.contains("at least 4"),
            "{why}"
        );
        assert!(refusal(&rules[..2], "b", "out/part-s.", needed).is_none());
        let mut off = rule("off", "", Some(1));
        off.enabled = false;
        assert!(refusal(&[off], "b", "out/part-s.", needed).is_none());
        // A rule narrower than our prefix still covers some uploads.
        assert!(refusal(
            &[rule("n", "out/part-s.1", Some(1))],
            "b",
            "out/part-s.",
            needed
        )
        .is_some());
    }
}
