//! twopc-objstore: the object store destination (the S3 API: AWS S3 and
//! compatible servers), on the `object_store` crate.
//!
//! # Layout in the bucket (`s3://bucket/prefix`)
//!
//! ```text
//! prefix/
//!   part-<txn-id><suffix>                      committed output, visible (named as the
//!                                              filesystem destination names its files)
//!   _twopc/<sink>/
//!     prepared/<txn-id>                        prepared marker: the handle with its location
//!     committed/<lineage>-<checkpoint>-<txn>   commit record (conditional create)
//!     expired/<txn-id>                         tombstone of retention cleanup (ms since epoch)
//!     retracted/<txn-id>                       tombstone of a retraction (ms since epoch)
//!     owners/<subtask>                         ownership lease (see `lease`)
//!     lineages/<lineage>                       how a lineage began
//!     runs/<run>                               the lineage a run writes in
//!     lost/<txn-id>                            note of a transaction found LOST
//!     operations/<time>-<seq>-<nonce>          a change made by hand (twopc reconcile, decide)
//!     history/<lineage>.<first>.<last>...      commit records folded together (see `history`)
//!   _twopc/<sink>/history.index                the live history segments (If-Match replaced)
//! ```
//!
//! Open and prepared transactions are not objects: they are the multipart
//! uploads of their final keys, listed with ListMultipartUploads.
//!
//! # Protocol
//!
//! * **Write**: the first record starts a multipart upload of the
//!   transaction's final key; records are buffered and sent as parts of
//!   `part_size` bytes (at least 5 MiB on S3), so memory stays at about
//!   one part. A part that fails poisons the transaction: no further write
//!   or prepare, only an abort.
//! * **Prepare**: the rest of the buffer goes as the last part; the byte
//!   count must equal what the handle counts. Then the prepared marker is
//!   written, and the writer puts the location (bucket, key, upload id,
//!   part ETags, exact bytes: `control::UploadLocation`) into the handle
//!   (`TransactionState::PreparedAt`, via `Destination::prepared_location`),
//!   so the checkpoint alone is enough to commit. The upload is never
//!   completed before the commit: parts are durable, the object does not
//!   exist.
//! * **Open or prepared?** The marker is written after the last part, and
//!   prepare returns only after the marker is durable. So an upload without
//!   a marker was never part of a checkpoint: it is `Open` (a crash between
//!   the last part and the marker leaves exactly that, and it is right: the
//!   prepare never returned). An upload whose marker cannot be read is
//!   `PreparedUnreadable`. A marker without an upload is a leftover of a
//!   commit or an abort interrupted before it removed it; it is not staged.
//! * **Commit**: a commit record present answers `AlreadyCommitted` if the
//!   object is there with the recorded size and ETag (`Missing` if it is
//!   gone, an error if it was replaced). Otherwise CompleteMultipartUpload
//!   with the handle's ids publishes the object atomically (its answer
//!   gives the object's ETag; the size is what the parts held), then the
//!   commit record is written with `PutMode::Create`. A complete that
//!   fails is never judged by its error (S3 answers NoSuchUpload for both
//!   completed and aborted uploads; moto answers 500): the object is
//!   looked at (HEAD: size and the `-<parts>` ETag). Present and matching:
//!   committed (the record is written now; also the repair of a crash
//!   between completion and record). Absent with the upload still open:
//!   an error, the outcome unknown, and the core retries with the same
//!   ids. Absent with no such upload: `Missing`, the evidence saying what
//!   was looked at (and an expiry tombstone, if any).
//! * **Abort**: every upload of the key is aborted, then the object is
//!   looked at: an object at the key means the commit was decided
//!   (`WasCommitted`; any upload beside it was a stray). Complete and abort
//!   of one upload are serialised by the server, so exactly one wins, and a
//!   complete that won shows as the object. `NotFound` when there was no
//!   upload.
//! * **Expire**: the tombstone first, then the abort, so a commit that
//!   finds the upload gone always finds why (in the other order a commit
//!   between the two steps read "removed outside twopc"). A crash between
//!   the two leaves a tombstone beside a live upload: harmless, since only
//!   a commit that finds nothing reads it (a commit of that upload still
//!   succeeds), and the next retention scan finishes the expiry. A
//!   commit that wins against the expiry removes no tombstone; the expiry,
//!   finding the object published, removes its own.
//! * **Retract**: a tombstone `retracted/<txn>` first, then the object,
//!   then the commit record. A commit of a retracted transaction that was
//!   already in flight (an older attempt that lives on) can PUT the record
//!   again after the retraction: so every commit, after its record is in
//!   place, looks for that tombstone, and if it is there removes the
//!   object and the record again (object first, so that a retraction
//!   interrupted after its tombstone never loses the record that would
//!   make its restart finish it) and answers `Missing`, never
//!   `Committed`. Either the commit's look comes after the tombstone (and
//!   undoes), or its record landed before the tombstone, and so before the
//!   retraction removes the record. The price: one HEAD per commit.
//! * **Fencing clean-up**: see `lease`.
//! * **Retention**: `ObjectStoreDestination::open_checked` refuses a
//!   bucket lifecycle rule `AbortIncompleteMultipartUpload` that covers
//!   this sink's uploads with fewer days than it needs (`retention`).
//! * **Ownership**: a lease object per subtask with conditional writes
//!   (`lease`, with the limits of that approach).
//! * **History**: `compact_history` folds commit records behind the
//!   policy's watermark into segment objects and merges small ones, every
//!   change decided by one conditional replacement (If-Match) of the
//!   history index, no lock and no clock involved; every reader reads the
//!   single record first and the segments after (see `history` for the
//!   argument). `history_tallies` answers from the index's segment names
//!   and the few single records.
#![forbid(unsafe_code)]

pub mod control;
pub mod credentials;
pub mod destination;
pub mod faults;
pub mod history;
mod lease;
pub mod names;
pub mod options;
pub mod retention;
pub mod s3api;

pub use credentials::{CredentialSource, Credentials, Secret};
pub use destination::ObjectStoreDestination;
pub use faults::{FaultAction, RequestFaults, RequestInfo, S3Call};
pub use options::{RecordFormat, S3Options};
pub use retention::needed_retention_ms;
