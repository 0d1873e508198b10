//! The replayable input: records with unique ids, read in order from an
//! offset. A checkpoint stores the offset; a restore resumes from it.

use twopc_core::records::RecordBatchBuf;

pub struct Source {
    len: usize,
}

/// Records of one chunk destined for one subtask, already framed as the
/// sink's batch format.
pub struct Batch {
    pub subtask: usize,
    pub records: Vec<usize>,
    pub bytes: RecordBatchBuf,
}

impl Source {
    pub fn new(len: usize) -> Self {
        Source { len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The payload of record `index`: unique, printable, no newline (the
    /// filesystem destination writes one record per line).
    pub fn payload(index: usize) -> String {
        format!("r{index}")
    }

    /// The record index of a payload read back from a destination.
    pub fn parse(bytes: &[u8]) -> Option<usize> {
        let text = std::str::from_utf8(bytes).ok()?;
        let index: usize = text.strip_prefix('r')?.parse().ok()?;
        (Self::payload(index) == text).then_some(index)
    }

    /// Records `from..to`, partitioned the way a rebalance would: record `i`
    /// goes to subtask `i % parallelism`. Subtasks without records get no
    /// batch (Flink would not call `invoke` for them).
    pub fn read(&self, from: usize, to: usize, parallelism: usize) -> Vec<Batch> {
        let mut batches: Vec<Batch> = (0..parallelism)
            .map(|subtask| Batch {
                subtask,
                records: Vec::new(),
                // Both layouts the JVM sends (line breaks after the records,
                // as for LINES output, or none): the output must not differ.
                bytes: if subtask % 2 == 0 {
                    RecordBatchBuf::terminated_by(b'\n')
                } else {
                    RecordBatchBuf::new()
                },
            })
            .collect();
        for i in from..to.min(self.len) {
            let b = &mut batches[i % parallelism];
            b.records.push(i);
            b.bytes.push(Self::payload(i).as_bytes());
        }
        batches.retain(|b| !b.records.is_empty());
        batches
    }
}
