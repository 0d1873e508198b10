//! How failures cross into Java.
//!
//! Every native method returns `Result<_, BridgeError>` from inside
//! `with_env`, and [`ThrowJava`] turns the error (or a caught panic) into a
//! pending Java exception before the method returns a dummy value. The Java
//! class follows the core's `TwopcError::kind()`, so the Flink side can tell
//! fatal errors (stop the job) from retryable ones (restart) by type alone,
//! and the message is the core's own text: it already names the sink,
//! subtask, checkpoint and transaction and says what to do.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use jni::errors::ErrorPolicy;
use jni::objects::{JClass, Weak};
use jni::strings::{JNIStr, JNIString};
use jni::{jni_str, Env};
use twopc_core::error::ErrorKind;
use twopc_core::TwopcError;

/// The Java exception classes the bridge throws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JavaException {
    /// Retryable: the job restarts from its last completed checkpoint.
    Twopc,
    Lost,
    Unresolved,
    Rewind,
    FreshStart,
    State,
    Config,
    RecordRejected,
    Ownership,
    /// Protocol misuse, unknown or closed sink ids, poisoned sinks.
    IllegalState,
    /// Malformed batches and arguments.
    IllegalArgument,
}

impl JavaException {
    const ALL: [JavaException; 11] = [
        JavaException::Twopc,
        JavaException::Lost,
        JavaException::Unresolved,
        JavaException::Rewind,
        JavaException::FreshStart,
        JavaException::State,
        JavaException::Config,
        JavaException::RecordRejected,
        JavaException::Ownership,
        JavaException::IllegalState,
        JavaException::IllegalArgument,
    ];

    fn class_name(self) -> &'static JNIStr {
        match self {
            JavaException::Twopc => jni_str!("io/twopc/flink/TwopcException"),
            JavaException::Lost => jni_str!("io/twopc/flink/TwopcLostTransactionException"),
            JavaException::Unresolved => {
                jni_str!("io/twopc/flink/TwopcUnresolvedCommitException")
            }
            JavaException::Rewind => jni_str!("io/twopc/flink/TwopcRewindException"),
            JavaException::FreshStart => jni_str!("io/twopc/flink/TwopcFreshStartException"),
            JavaException::State => jni_str!("io/twopc/flink/TwopcStateException"),
            JavaException::Config => jni_str!("io/twopc/flink/TwopcConfigException"),
            JavaException::RecordRejected => {
                jni_str!("io/twopc/flink/TwopcRecordRejectedException")
            }
            JavaException::Ownership => jni_str!("io/twopc/flink/TwopcOwnershipException"),
            JavaException::IllegalState => jni_str!("java/lang/IllegalStateException"),
            JavaException::IllegalArgument => jni_str!("java/lang/IllegalArgumentException"),
        }
    }

    /// The class for a core error: an exhaustive match on its kind, so a
    /// new kind cannot be added without choosing its class here.
    pub(crate) fn for_core(err: &TwopcError) -> Self {
        match err.kind() {
            ErrorKind::Lost => JavaException::Lost,
            ErrorKind::Unresolved => JavaException::Unresolved,
            ErrorKind::Rewind => JavaException::Rewind,
            ErrorKind::FreshStart => JavaException::FreshStart,
            ErrorKind::State => JavaException::State,
            ErrorKind::Config => JavaException::Config,
            ErrorKind::Record => JavaException::RecordRejected,
            // An earlier attempt still shutting down is retryable.
            ErrorKind::Ownership if err.is_fatal() => JavaException::Ownership,
            ErrorKind::Ownership => JavaException::Twopc,
            ErrorKind::Protocol => JavaException::IllegalState,
            ErrorKind::Batch => JavaException::IllegalArgument,
            ErrorKind::Destination => JavaException::Twopc,
        }
    }
}

/// What a native method can fail with.
#[derive(Debug)]
pub(crate) enum BridgeError {
    /// An error of the protocol; the class follows its kind.
    Core(TwopcError),
    /// An error the bridge itself detected (bad id, bad argument, ...).
    Java(JavaException, String),
    /// A JNI call failed. If it left a Java exception pending, that one is
    /// more precise and propagates unchanged.
    Jni(jni::errors::Error),
}

impl BridgeError {
    pub(crate) fn illegal_state(msg: impl Into<String>) -> Self {
        BridgeError::Java(JavaException::IllegalState, msg.into())
    }
    pub(crate) fn illegal_argument(msg: impl Into<String>) -> Self {
        BridgeError::Java(JavaException::IllegalArgument, msg.into())
    }
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        BridgeError::Java(JavaException::Config, msg.into())
    }
    pub(crate) fn state(msg: impl Into<String>) -> Self {
        BridgeError::Java(JavaException::State, msg.into())
    }

    fn exception(&self) -> JavaException {
        match self {
            BridgeError::Core(e) => JavaException::for_core(e),
            BridgeError::Java(class, _) => *class,
            BridgeError::Jni(_) => JavaException::Twopc,
        }
    }
}

impl fmt::Display for BridgeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BridgeError::Core(e) => write!(f, "{e}"),
            BridgeError::Java(_, msg) => f.write_str(msg),
            BridgeError::Jni(e) => write!(f, "twopc JNI bridge: JNI call failed: {e}"),
        }
    }
}

impl std::error::Error for BridgeError {}

// `with_env` requires the closure's error type to absorb JNI errors.
impl From<jni::errors::Error> for BridgeError {
    fn from(e: jni::errors::Error) -> Self {
        BridgeError::Jni(e)
    }
}

impl From<TwopcError> for BridgeError {
    fn from(e: TwopcError) -> Self {
        BridgeError::Core(e)
    }
}

impl From<twopc_core::ConfigError> for BridgeError {
    fn from(e: twopc_core::ConfigError) -> Self {
        BridgeError::Core(TwopcError::Config(e))
    }
}

pub(crate) type BridgeResult<T> = Result<T, BridgeError>;

/// References to the exception classes, taken in `JNI_OnLoad` on the Java
/// thread that loads the library. `FindClass` resolves through the caller's
/// class loader only on such a thread; under Flink the classes live in the
/// job's child-first class loader, which a later lookup from an arbitrary
/// context could miss. Each class loader loads its own copy of the library,
/// so these statics are per class loader too.
///
/// The references are weak globals: a strong global reference to a class is
/// a GC root that pins its class loader, so every Flink job restart would
/// leak the previous attempt's class loader (metaspace) and library copy.
/// While a native method runs, `NativeBridge`'s class loader is alive and
/// with it every class it defined, so upgrading never fails then.
struct ExceptionClasses([Weak<JClass<'static>>; JavaException::ALL.len()]);

static CLASSES: OnceLock<ExceptionClasses> = OnceLock::new();

pub(crate) fn cache_exception_classes(env: &mut Env<'_>) -> jni::errors::Result<()> {
    let mut classes = Vec::with_capacity(JavaException::ALL.len());
    for class in JavaException::ALL {
        let local = env.find_class(class.class_name())?;
        classes.push(env.new_weak_ref(&local)?);
    }
    let classes: [Weak<JClass<'static>>; JavaException::ALL.len()] = classes
        .try_into()
        .unwrap_or_else(|_| unreachable!("one class per JavaException"));
    // A second JNI_OnLoad of the same library copy does not happen; if it
    // did, the first set of references is as good as the second.
    let _ = CLASSES.set(ExceptionClasses(classes));
    Ok(())
}

/// Throws `class` with `msg`, unless an exception is already pending.
pub(crate) fn throw(env: &mut Env<'_>, class: JavaException, msg: &str) {
    if env.exception_check() {
        return;
    }
    let msg = JNIString::new(msg);
    let index = JavaException::ALL
        .iter()
        .position(|c| *c == class)
        .unwrap_or(0);
    let cached = CLASSES
        .get()
        .and_then(|c| c.0[index].upgrade_local(env).ok().flatten());
    // `throw_new` reports `Err(JavaException)` when it *succeeded* in
    // throwing; either way there is nothing more to do here.
    let _ = match cached {
        Some(local) => env.throw_new(&local, &msg),
        // Only reachable if JNI_OnLoad did not run, which the JVM guarantees
        // it does; looking the class up by name is the best remaining try.
        None => env.throw_new(class.class_name(), &msg),
    };
}

/// A panic's location (`file:line`), kept in a fixed buffer: a
/// thread-local value with a destructor (a `String`) would register a TLS
/// destructor that keeps this library copy mapped until the thread exits,
/// so a class loader's copy could not be unloaded after any panic (found by
/// review; the reason `twopc_core::interrupt` avoids them too).
#[derive(Clone, Copy)]
struct PanicLocation {
    text: [u8; PanicLocation::CAPACITY],
    len: usize,
}

impl PanicLocation {
    const CAPACITY: usize = 240;

    /// `text`, cut at a character boundary to fit.
    fn new(text: &str) -> PanicLocation {
        let mut len = text.len().min(Self::CAPACITY);
        while !text.is_char_boundary(len) {
            len -= 1;
        }
        let mut buf = [0u8; Self::CAPACITY];
        buf[..len].copy_from_slice(&text.as_bytes()[..len]);
        PanicLocation { text: buf, len }
    }

    fn as_str(&self) -> &str {
        // Always a prefix of a `str` cut at a character boundary.
        std::str::from_utf8(&self.text[..self.len]).unwrap_or("unknown location")
    }
}

thread_local! {
    /// Where the last panic on this thread happened, recorded by the panic
    /// hook: the payload alone does not carry the location, and the
    /// exception message should point at the code.
    static LAST_PANIC_LOCATION: Cell<Option<PanicLocation>> = const { Cell::new(None) };
}

/// Replaces the default hook (a message on stderr, which under Flink ends
/// up in the TaskManager's .out file where nobody looks) with one that logs
/// through the Java bridge and remembers the location for the exception.
pub(crate) fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "unknown location".to_string());
        let message = payload_text(info.payload());
        log::error!(target: "twopc::panic", "Rust panic at {location}: {message}");
        LAST_PANIC_LOCATION.with(|l| l.set(Some(PanicLocation::new(&location))));
    }));
}

fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// The message of the `TwopcException` a panic becomes.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    let location = LAST_PANIC_LOCATION
        .with(|l| l.take())
        .map(|l| format!(" at {}", l.as_str()))
        .unwrap_or_default();
    format!(
        "internal error (Rust panic): {}{location}; this is a bug in twopc, please report it",
        payload_text(payload)
    )
}

/// The error policy of every native method: errors and panics become Java
/// exceptions and the method returns its type's default (0, null), which
/// Java never sees because the exception is pending.
pub(crate) struct ThrowJava;

impl<T: Default> ErrorPolicy<T, BridgeError> for ThrowJava {
    type Captures<'unowned_env_local: 'native_method, 'native_method> = ();

    fn on_error<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut (),
        err: BridgeError,
    ) -> jni::errors::Result<T> {
        // A pending exception (a JNI call that threw) is the real cause.
        if !env.exception_check() {
            throw(env, err.exception(), &err.to_string());
        }
        Ok(T::default())
    }

    fn on_panic<'unowned_env_local: 'native_method, 'native_method>(
        env: &mut Env<'unowned_env_local>,
        _cap: &mut (),
        payload: Box<dyn Any + Send + 'static>,
    ) -> jni::errors::Result<T> {
        let msg = panic_message(&*payload);
        // Dropping a payload runs arbitrary Drop code that could panic
        // again; that second panic must not unwind into the JVM.
        if let Err(again) = catch_unwind(AssertUnwindSafe(|| drop(payload))) {
            std::mem::forget(again);
        }
        if !env.exception_check() {
            throw(env, JavaException::Twopc, &msg);
        }
        Ok(T::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use twopc_core::error::{RejectedRecord, SinkScope};
    use twopc_core::handle::HandleError;
    use twopc_core::TransactionId;
    use twopc_core::{ConfigError, SinkId};

    #[test]
    fn core_kinds_map_to_their_classes() {
        let scope = SinkScope {
            sink: SinkId::new("s").unwrap(),
            subtask: 0,
        };
        let state = TwopcError::State {
            scope: scope.clone(),
            source: HandleError::Truncated { len: 1, needed: 8 },
        };
        assert_eq!(JavaException::for_core(&state), JavaException::State);
        let config = TwopcError::Config(ConfigError::new("x"));
        assert_eq!(JavaException::for_core(&config), JavaException::Config);
        let protocol = TwopcError::Protocol {
            scope: scope.clone(),
            message: "m".into(),
        };
        assert_eq!(
            JavaException::for_core(&protocol),
            JavaException::IllegalState
        );
        // A record the destination can never accept stops the job: its own
        // fatal class, not the retryable base class.
        let record = TwopcError::RecordRejected(Box::new(RejectedRecord {
            scope,
            transaction: TransactionId::parse("s.0.00000000000000ab.1").unwrap().id,
            checkpoint: Some(3),
            position: Some(7),
            column: Some("id".into()),
            reason: "PostgreSQL: ERROR 22003: out of range".into(),
            preview: "99999999999999999999\\tx".into(),
        }));
        assert!(record.is_fatal());
        assert_eq!(
            JavaException::for_core(&record),
            JavaException::RecordRejected
        );
        assert_eq!(
            JavaException::RecordRejected.class_name().to_string(),
            "io/twopc/flink/TwopcRecordRejectedException"
        );
    }

    #[test]
    fn panic_payloads_keep_their_text() {
        let s: Box<dyn Any + Send> = Box::new("static text");
        assert!(panic_message(&*s).contains("internal error (Rust panic): static text"));
        let s: Box<dyn Any + Send> = Box::new(format!("formatted {}", 42));
        assert!(panic_message(&*s).contains("formatted 42"));
        let s: Box<dyn Any + Send> = Box::new(7u8);
        assert!(panic_message(&*s).contains("non-string panic payload"));
    }

    /// The location a panic leaves for its exception's message, cut to
    /// the buffer at a character boundary, taken once.
    #[test]
    fn a_panic_location_is_kept_whole_or_cut_at_a_character() {
        assert_eq!(
            PanicLocation::new("src/lib.rs:42").as_str(),
            "src/lib.rs:42"
        );
        // 239 bytes, then a character of two: cut before it.
        let long = format!("{}xé:7", "d/".repeat(119));
        let cut = PanicLocation::new(&long);
        assert!(cut.as_str().len() <= PanicLocation::CAPACITY);
        assert!(long.starts_with(cut.as_str()));
        assert_eq!(cut.as_str(), format!("{}x", "d/".repeat(119)));
        LAST_PANIC_LOCATION.with(|l| l.set(Some(PanicLocation::new("x.rs:1"))));
        let s: Box<dyn Any + Send> = Box::new("boom");
        assert!(panic_message(&*s).contains("boom at x.rs:1"));
        assert!(!panic_message(&*s).contains("x.rs:1"), "taken once");
    }
}
