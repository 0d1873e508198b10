//! A writer's own checkpoint state: what a restarted writer needs besides
//! the prepared transactions (which the committer keeps): the lineage it
//! continues, and the transactions it had open, to abort them.
//!
//! One small, constant-size element per subtask, whatever the maximum
//! parallelism: after a change of parallelism some subtasks receive no
//! element at all, and learn the lineage from the destination instead,
//! where every subtask that did receive one records it for its run (see
//! `writer_session`).

use serde::{Deserialize, Serialize};

use crate::envelope::PayloadKind;
use crate::handle::{decode_payload, encode_payload, HandleError, TransactionHandle};
use crate::ids::{LineageId, RunId, SinkId};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterState {
    pub sink: SinkId,
    pub lineage: LineageId,
    /// The run (Flink job id) that wrote the state.
    pub run: RunId,
    /// The subtask that wrote it.
    pub subtask: u32,
    /// Transactions open when the state was written: never part of a
    /// checkpoint, aborted on restore.
    pub open: Vec<TransactionHandle>,
}

impl WriterState {
    pub fn encode(&self) -> Vec<u8> {
        encode_payload(PayloadKind::WriterState, self)
    }

    /// Decodes and checks writer state read back from a checkpoint. Any
    /// input gives a typed error, never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, HandleError> {
        let state: WriterState = decode_payload(PayloadKind::WriterState, bytes)?;
        SinkId::new(state.sink.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        RunId::new(state.run.as_str()).map_err(|e| HandleError::Invalid(e.to_string()))?;
        for h in &state.open {
            h.validate()?;
            if h.sink != state.sink || h.lineage != state.lineage || h.prepared().is_some() {
                return Err(HandleError::Invalid(format!(
                    "writer state of sink '{}' lineage {} lists transaction {} (sink '{}', \
                     lineage {}, {}) as open",
                    state.sink,
                    state.lineage,
                    h.transaction,
                    h.sink,
                    h.lineage,
                    if h.prepared().is_some() {
                        "prepared"
                    } else {
                        "open"
                    }
                )));
            }
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::TransactionState;
    use crate::ids::TransactionId;

    fn state() -> WriterState {
        let sink = SinkId::new("s").unwrap();
        WriterState {
            sink: sink.clone(),
            lineage: LineageId(9),
            run: RunId::new("r").unwrap(),
            subtask: 1,
            open: vec![TransactionHandle {
                sink: sink.clone(),
                transaction: TransactionId::compose(&sink, 1, 5, 0),
                lineage: LineageId(9),
                run: RunId::new("r").unwrap(),
                subtask: 1,
                parallelism: 2,
                begun_at_ms: 3,
                state: TransactionState::Open,
            }],
        }
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let bytes = state().encode();
        assert_eq!(WriterState::decode(&bytes).unwrap(), state());
        for cut in 0..bytes.len() {
            assert!(WriterState::decode(&bytes[..cut]).is_err());
        }
        // A handle is not a writer state.
        assert!(WriterState::decode(&state().open[0].encode()).is_err());
        // An open transaction of another lineage is inconsistent.
        let mut bad = state();
        bad.open[0].lineage = LineageId(1);
        assert!(WriterState::decode(&bad.encode()).is_err());
    }
}
