//! The writer state machine of one subtask: begin a transaction, stage
//! records into it, prepare it at a checkpoint, begin the next.
//!
//! ```text
//!            begin              prepare(checkpoint)
//!   Idle ──────────────▶ Open ─────────────────────▶ Idle  (handle returned,
//!                         │  ▲                              goes into state)
//!                  write  └──┘
//! ```
//!
//! At most one transaction is open at a time, as in Flink's
//! `TwoPhaseCommitSinkFunction`. Prepared transactions belong to the
//! committer from then on.
//!
//! A transaction whose `write` or `prepare` failed part-way is *poisoned*:
//! the destination may hold some of its records and not others (a buffer
//! lost with the failed call, a short write), so it can only be aborted.
//! Preparing it again would publish a transaction that lacks records its
//! handle counts; the writer refuses that as a protocol error, and the job
//! restarts from its last checkpoint and replays the records.

use crate::config::SubtaskContext;
use crate::destination::Destination;
use crate::error::{DestinationError, RecordPosition, RejectedRecord, SinkScope, TwopcError};
use crate::handle::{PreparedInfo, TransactionHandle, TransactionState};
use crate::ids::{CheckpointId, LineageId, TransactionId};
use crate::records::RecordBatch;

#[derive(Debug)]
struct OpenTransaction {
    handle: TransactionHandle,
    records: u64,
    bytes: u64,
    /// Why the transaction can only be aborted (see the module docs).
    poisoned: Option<String>,
}

#[derive(Debug)]
pub struct Writer {
    ctx: SubtaskContext,
    lineage: LineageId,
    attempt_nonce: u64,
    next_sequence: u64,
    open: Option<OpenTransaction>,
}

/// What the writer has staged into the open transaction so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenStats {
    pub records: u64,
    pub bytes: u64,
}

const RESTART_HINT: &str = "The job will restart from its last completed checkpoint and replay \
    these records; committed output is not affected.";

impl Writer {
    pub fn new(ctx: SubtaskContext, lineage: LineageId, attempt_nonce: u64) -> Self {
        Writer {
            ctx,
            lineage,
            attempt_nonce,
            next_sequence: 0,
            open: None,
        }
    }

    pub fn attempt_nonce(&self) -> u64 {
        self.attempt_nonce
    }

    pub fn lineage(&self) -> LineageId {
        self.lineage
    }

    /// The handle of the open transaction, if any.
    pub fn open_handle(&self) -> Option<TransactionHandle> {
        self.open.as_ref().map(|o| o.handle.clone())
    }

    /// The id of the open transaction, if any.
    pub fn current(&self) -> Option<&TransactionId> {
        self.open.as_ref().map(|o| &o.handle.transaction)
    }

    pub fn open_stats(&self) -> OpenStats {
        self.open
            .as_ref()
            .map(|o| OpenStats {
                records: o.records,
                bytes: o.bytes,
            })
            .unwrap_or_default()
    }

    pub fn begin<D: Destination>(
        &mut self,
        dest: &mut D,
        now_ms: u64,
    ) -> Result<TransactionHandle, TwopcError> {
        if let Some(open) = &self.open {
            return Err(self.misuse(format!(
                "transaction {} is still open; prepare or abort it before beginning another",
                open.handle.transaction
            )));
        }
        let transaction = TransactionId::compose(
            &self.ctx.sink,
            self.ctx.subtask,
            self.attempt_nonce,
            self.next_sequence,
        );
        self.next_sequence += 1;
        let handle = TransactionHandle {
            sink: self.ctx.sink.clone(),
            transaction,
            lineage: self.lineage,
            run: self.ctx.run.clone(),
            subtask: self.ctx.subtask,
            parallelism: self.ctx.parallelism,
            begun_at_ms: now_ms,
            state: TransactionState::Open,
        };
        crate::writer_session::fault_point!("twopc-begin", self.ctx.scope(), &handle.transaction);
        dest.begin(&handle)
            .map_err(|source| TwopcError::Destination {
                scope: self.ctx.scope(),
                action: "beginning",
                transaction: handle.transaction.clone(),
                consequence: RESTART_HINT,
                source,
            })?;
        log::debug!(
            "{}: began transaction {}",
            self.ctx.scope(),
            handle.transaction
        );
        self.open = Some(OpenTransaction {
            handle: handle.clone(),
            records: 0,
            bytes: 0,
            poisoned: None,
        });
        Ok(handle)
    }

    /// Stages a batch into the open transaction `txn`. A failure poisons
    /// the transaction (see the module docs).
    pub fn write<D: Destination>(
        &mut self,
        dest: &mut D,
        txn: &TransactionId,
        batch: RecordBatch<'_>,
    ) -> Result<OpenStats, TwopcError> {
        let scope = self.ctx.scope();
        let open = self.usable_open(txn, "write to")?;
        if !batch.is_empty() {
            if let Err(source) = dest.write(txn, batch) {
                open.poisoned = Some(format!("a write failed: {source}"));
                return Err(failure(
                    scope,
                    open,
                    source,
                    None,
                    "writing to",
                    RESTART_HINT,
                ));
            }
            open.records += batch.len();
            open.bytes += batch.payload_bytes();
        }
        Ok(OpenStats {
            records: open.records,
            bytes: open.bytes,
        })
    }

    /// Prepares the open transaction `txn` for `checkpoint`: durable and
    /// invisible. Returns the prepared handle, which the caller stores in
    /// the checkpoint. On failure the transaction stays open, poisoned, so
    /// that it can still be aborted and nothing else.
    pub fn prepare<D: Destination>(
        &mut self,
        dest: &mut D,
        txn: &TransactionId,
        checkpoint: CheckpointId,
        now_ms: u64,
    ) -> Result<TransactionHandle, TwopcError> {
        let scope = self.ctx.scope();
        let open = self.usable_open(txn, "prepare")?;
        let mut handle = open.handle.clone();
        handle.state = TransactionState::Prepared(PreparedInfo {
            checkpoint,
            records: open.records,
            bytes: open.bytes,
            prepared_at_ms: now_ms,
        });
        // Test-only: a destination prepare that fails part-way (as on a
        // full disk), so the poisoning path runs under a real Flink job.
        #[cfg(feature = "failpoints")]
        let injected = fail::eval("twopc-prepare-destination", |_| {
            crate::error::DestinationError::new(
                crate::error::DestinationErrorKind::Io,
                "fail point twopc-prepare-destination triggered (as if the disk were full)",
            )
        });
        #[cfg(not(feature = "failpoints"))]
        let injected: Option<crate::error::DestinationError> = None;
        let prepared = match injected {
            Some(e) => Err(e),
            // A destination that needs more than the transaction id to find
            // its staged data after a restart (an object store's upload id
            // and part ids) says where it is; the handle carries it into the
            // checkpoint. Failing to say is a failed prepare.
            None => dest.prepare(&handle).and_then(|()| {
                if let Some(location) = dest.prepared_location(txn)? {
                    if let TransactionState::Prepared(info) = &handle.state {
                        handle.state = TransactionState::PreparedAt {
                            info: info.clone(),
                            location,
                        };
                    }
                }
                Ok(())
            }),
        };
        if let Err(source) = prepared {
            open.poisoned = Some(format!(
                "its prepare for checkpoint {checkpoint} failed: {source}"
            ));
            return Err(failure(
                scope,
                open,
                source,
                Some(checkpoint),
                "preparing",
                "Checkpoint fails; the transaction can only be aborted now, and the job restarts \
                 from the previous completed checkpoint and replays these records.",
            ));
        }
        self.open = None;
        log::debug!(
            "{}: prepared transaction {} for checkpoint {checkpoint} ({} records)",
            self.ctx.scope(),
            txn,
            handle.prepared().map(|p| p.records).unwrap_or(0)
        );
        Ok(handle)
    }

    /// Forgets the open transaction after it was aborted.
    pub fn forget(&mut self, txn: &TransactionId) {
        if self.current() == Some(txn) {
            self.open = None;
        }
    }

    fn open_mut(&mut self, txn: &TransactionId) -> Result<&mut OpenTransaction, TwopcError> {
        let message = match &self.open {
            Some(open) if &open.handle.transaction == txn => None,
            Some(open) => Some(format!(
                "transaction {txn} is not the open transaction ({})",
                open.handle.transaction
            )),
            None => Some(format!(
                "transaction {txn} is not open (it was prepared, aborted or never begun)"
            )),
        };
        match message {
            Some(message) => Err(self.misuse(message)),
            None => Ok(self.open.as_mut().expect("checked above")),
        }
    }

    /// The open transaction `txn`, unless it is poisoned.
    fn usable_open(
        &mut self,
        txn: &TransactionId,
        what: &str,
    ) -> Result<&mut OpenTransaction, TwopcError> {
        let scope = self.ctx.scope();
        let open = self.open_mut(txn)?;
        if let Some(why) = &open.poisoned {
            return Err(TwopcError::Protocol {
                scope,
                message: format!(
                    "refusing to {what} transaction {txn}: it is poisoned because {why}. Some of \
                     its records may be missing at the destination, so it can only be aborted; \
                     the job must restart from its last completed checkpoint and replay them"
                ),
            });
        }
        Ok(open)
    }

    fn misuse(&self, message: String) -> TwopcError {
        TwopcError::Protocol {
            scope: self.ctx.scope(),
            message,
        }
    }
}

/// The error of a failed write or prepare: a record the destination can
/// never accept becomes [`TwopcError::RecordRejected`] (the job stops once);
/// anything else is a destination failure (the job restarts).
fn failure(
    scope: SinkScope,
    open: &OpenTransaction,
    source: DestinationError,
    checkpoint: Option<CheckpointId>,
    action: &'static str,
    consequence: &'static str,
) -> TwopcError {
    match source.record {
        Some(fault) => {
            let position = match fault.position {
                RecordPosition::InBatch(i) => Some(open.records + i),
                RecordPosition::InTransaction(i) => Some(i),
                RecordPosition::Unknown => None,
            };
            TwopcError::RecordRejected(Box::new(RejectedRecord {
                scope,
                transaction: open.handle.transaction.clone(),
                checkpoint,
                position,
                column: fault.column,
                reason: fault.reason,
                preview: fault.preview,
            }))
        }
        None => TwopcError::Destination {
            scope,
            action,
            transaction: open.handle.transaction.clone(),
            consequence,
            source,
        },
    }
}
