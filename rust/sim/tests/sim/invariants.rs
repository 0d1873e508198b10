//! The properties every schedule must keep. Each check returns a message
//! saying what broke; the runner adds the seed and the trace.

use std::collections::{BTreeMap, BTreeSet};

use twopc_core::error::{LostTransaction, PreparedOnFreshStart, RewindDetected};
use twopc_core::{CheckpointId, TransactionId};

use super::source::Source;

/// A short list for messages.
fn sample<T: std::fmt::Debug>(items: impl IntoIterator<Item = T>) -> String {
    let v: Vec<T> = items.into_iter().collect();
    let shown: Vec<String> = v.iter().take(12).map(|x| format!("{x:?}")).collect();
    if v.len() > shown.len() {
        format!("[{} ... {} in all]", shown.join(", "), v.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}

/// How many times each record index is visible.
fn tally(visible: &[Vec<u8>]) -> Result<BTreeMap<usize, usize>, String> {
    let mut counts = BTreeMap::new();
    for v in visible {
        let index = Source::parse(v).ok_or_else(|| {
            format!(
                "visible output holds {:?}, which no input record produced",
                String::from_utf8_lossy(v)
            )
        })?;
        *counts.entry(index).or_insert(0) += 1;
    }
    Ok(counts)
}

/// At any moment: nothing visible twice, and nothing visible that no
/// completed checkpoint covers (output only appears once the checkpoint of
/// its records completed).
pub fn at_most_once(visible: &[Vec<u8>], high_water: usize) -> Result<(), String> {
    let counts = tally(visible)?;
    let dups: Vec<usize> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(i, _)| *i)
        .collect();
    if !dups.is_empty() {
        return Err(format!("records visible more than once: {}", sample(dups)));
    }
    let ahead: Vec<usize> = counts
        .keys()
        .filter(|i| **i >= high_water)
        .copied()
        .collect();
    if !ahead.is_empty() {
        return Err(format!(
            "records visible that no completed checkpoint covers (highest completed offset \
             {high_water}): {}",
            sample(ahead)
        ));
    }
    Ok(())
}

/// At the end of a job that finished: every input record visible once.
pub fn exactly_once(visible: &[Vec<u8>], input_len: usize) -> Result<(), String> {
    at_most_once(visible, input_len)?;
    let counts = tally(visible)?;
    let missing: Vec<usize> = (0..input_len).filter(|i| !counts.contains_key(i)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "the job finished successfully but records are missing from the output (skipped \
             silently): {}",
            sample(missing)
        ));
    }
    Ok(())
}

/// Every record below `offset` (the latest completed checkpoint's) is
/// visible or held by a transaction whose fate is still open (`pending`).
pub fn completed_output_accounted_for(
    visible: &[Vec<u8>],
    pending: &[usize],
    offset: usize,
) -> Result<(), String> {
    let counts = tally(visible)?;
    let pending: BTreeSet<usize> = pending.iter().copied().collect();
    let vanished: Vec<usize> = (0..offset)
        .filter(|i| !counts.contains_key(i) && !pending.contains(i))
        .collect();
    if vanished.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "output of completed checkpoints vanished (neither visible, nor staged, nor reported \
             lost): records {}",
            sample(vanished)
        ))
    }
}

/// A finished job leaves nothing staged.
pub fn nothing_staged(staged: &[String]) -> Result<(), String> {
    if staged.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the job finished but staged transactions are left: {}",
            sample(staged)
        ))
    }
}

/// A LOST report must be true: the destination really timed the
/// transaction out, and exactly the records it was given are missing.
pub fn lost_is_genuine(
    lost: &LostTransaction,
    expired: &BTreeSet<TransactionId>,
    given: &[usize],
    visible: &[Vec<u8>],
) -> Result<(), String> {
    if !expired.contains(&lost.transaction) {
        return Err(format!(
            "LOST names {} but the destination never expired it (expired: {})",
            lost.transaction,
            sample(expired)
        ));
    }
    if lost.records != given.len() as u64 {
        return Err(format!(
            "LOST says {} had {} records but it was given {}",
            lost.transaction,
            lost.records,
            given.len()
        ));
    }
    let counts = tally(visible)?;
    let present: Vec<usize> = given
        .iter()
        .filter(|i| counts.contains_key(i))
        .copied()
        .collect();
    if !present.is_empty() {
        return Err(format!(
            "LOST names {} but some of its records are visible: {}",
            lost.transaction,
            sample(present)
        ));
    }
    Ok(())
}

/// What a start refused as a rewind may have made visible: nothing, or,
/// in the Sink V2 topology, the records of the restored checkpoint's own
/// committables (`allowed`). Flink initializes the committer apart from
/// the writer, whose start-up check refuses, and the committer commits its
/// restored committables at once; they belong to a completed checkpoint
/// no later than the restored one, so every way forward commits them, and
/// they are not output the REWIND report is about. Nothing visible may go
/// away, and nothing else may appear.
pub fn rewind_left_visible_alone(
    visible_before: &[Vec<u8>],
    visible_after: &[Vec<u8>],
    allowed: &BTreeSet<usize>,
) -> Result<(), String> {
    let before = tally(visible_before)?;
    let after = tally(visible_after)?;
    let gone: Vec<usize> = before
        .iter()
        .filter(|(i, n)| after.get(i).copied().unwrap_or(0) < **n)
        .map(|(i, _)| *i)
        .collect();
    let appeared: Vec<usize> = after
        .iter()
        .filter(|(i, n)| before.get(i).copied().unwrap_or(0) < **n && !allowed.contains(i))
        .map(|(i, _)| *i)
        .collect();
    if gone.is_empty() && appeared.is_empty() {
        return Ok(());
    }
    Err(format!(
        "a start refused as a rewind changed the visible output: gone {}, appeared {} (beyond          the restored checkpoint's own committables)",
        sample(gone),
        sample(appeared)
    ))
}

/// A rewind report names every transaction committed after the restored
/// checkpoint, and the refused start changed nothing visible but what
/// [`rewind_left_visible_alone`] allows.
pub fn rewind_is_complete(
    r: &RewindDetected,
    expected: &BTreeSet<(TransactionId, CheckpointId)>,
    visible_before: &[Vec<u8>],
    visible_after: &[Vec<u8>],
    allowed: &BTreeSet<usize>,
) -> Result<(), String> {
    let named: BTreeSet<(TransactionId, CheckpointId)> =
        r.committed_after.iter().cloned().collect();
    if &named != expected {
        return Err(format!(
            "REWIND from checkpoint {} names {} but the destination holds {} committed after it",
            r.restored_checkpoint,
            sample(&named),
            sample(expected)
        ));
    }
    rewind_left_visible_alone(visible_before, visible_after, allowed)
}

type Pairs = BTreeSet<(TransactionId, CheckpointId)>;

/// A start without state refused because of prepared transactions (unless
/// the policy aborts them) or decided commits names every one of them, and
/// changed none: `before` and `after` are (prepared, decided).
pub fn refusal_is_complete(
    p: &PreparedOnFreshStart,
    before: (&Pairs, &Pairs),
    names_prepared: bool,
    after: (&Pairs, &Pairs),
) -> Result<(), String> {
    let named: Pairs = p.prepared.iter().cloned().collect();
    let expected = if names_prepared {
        before.0.clone()
    } else {
        Pairs::new()
    };
    if named != expected {
        return Err(format!(
            "PREPARED_ON_FRESH_START names {} prepared but the destination held {}",
            sample(&named),
            sample(&expected)
        ));
    }
    let named_decided: Pairs = p.decided.iter().cloned().collect();
    if &named_decided != before.1 {
        return Err(format!(
            "PREPARED_ON_FRESH_START names {} decided but the destination held {}",
            sample(&named_decided),
            sample(before.1)
        ));
    }
    if after != before {
        return Err(format!(
            "a start without state changed what it must refuse over: prepared before {}, after \
             {}; decided before {}, after {}",
            sample(before.0),
            sample(after.0),
            sample(before.1),
            sample(after.1)
        ));
    }
    Ok(())
}

/// A start refused because earlier lineages hold committed output names
/// every one of them, and changed nothing visible.
pub fn existing_output_is_complete(
    e: &twopc_core::error::ExistingOutput,
    expected: &BTreeSet<twopc_core::LineageId>,
    visible_before: &[Vec<u8>],
    visible_after: &[Vec<u8>],
) -> Result<(), String> {
    let named: BTreeSet<twopc_core::LineageId> = e.lineages.iter().map(|l| l.lineage).collect();
    if &named != expected {
        return Err(format!(
            "EXISTING_OUTPUT names lineages {named:?} but the destination holds output of \
             {expected:?}"
        ));
    }
    let (mut a, mut b) = (visible_before.to_vec(), visible_after.to_vec());
    a.sort();
    b.sort();
    if a != b {
        return Err("a start refused for existing output changed the visible output".to_string());
    }
    Ok(())
}
