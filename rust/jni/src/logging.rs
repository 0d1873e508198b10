//! Rust `log` records into the JVM's SLF4J, so the core's messages land in
//! Flink's log files with Flink's levels instead of on stderr.
//!
//! Each record becomes a call of the static Java method
//! `io.twopc.flink.internal.NativeLog.log(int level, String target, String
//! message)`; `level` is `log::Level as int` (1 = ERROR .. 5 = TRACE). The
//! maximum level is read once, when the library loads, from
//! `NativeLog.maxLevel()` (what the SLF4J logger `twopc` has enabled), so
//! records below it cost no JNI call and no formatting.

use std::cell::Cell;
use std::sync::OnceLock;

use jni::ids::JStaticMethodID;
use jni::objects::{JClass, JString, Weak};
use jni::signature::{JavaType, Primitive};
use jni::sys::jint;
use jni::{jni_sig, jni_str, Env, JValue, JavaVM};
use log::{LevelFilter, Log, Metadata, Record};

struct JavaLogger {
    /// Looked up once on the loading thread, so that records from any
    /// thread reach the class of the right class loader. Weak, so as not to
    /// pin the job's class loader (see `error::ExceptionClasses`); each
    /// record upgrades it, which also keeps the class (and so `method`)
    /// valid for the call.
    class: Weak<JClass<'static>>,
    method: JStaticMethodID,
}

static LOGGER: OnceLock<JavaLogger> = OnceLock::new();

thread_local! {
    /// Set while this thread forwards a record. A Java logging backend that
    /// ended up calling back into this library (and logging) would
    /// otherwise recurse without end.
    static FORWARDING: Cell<bool> = const { Cell::new(false) };
}

/// Installs the bridge as this library copy's `log` logger. Runs once, in
/// `JNI_OnLoad`, on the Java thread that loads the library, where class
/// lookup sees the job's class loader.
pub(crate) fn install(env: &mut Env<'_>) -> jni::errors::Result<()> {
    let class = env.find_class(jni_str!("io/twopc/flink/internal/NativeLog"))?;
    let method = env.get_static_method_id(
        &class,
        jni_str!("log"),
        jni_sig!("(ILjava/lang/String;Ljava/lang/String;)V"),
    )?;
    let max = env
        .call_static_method(&class, jni_str!("maxLevel"), jni_sig!("()I"), &[])?
        .i()?;
    let class = env.new_weak_ref(&class)?;
    let logger = LOGGER.get_or_init(|| JavaLogger { class, method });
    // Fails only if a logger is already set in this library copy, i.e. this
    // ran twice; the first installation stays in place.
    if log::set_logger(logger).is_ok() {
        log::set_max_level(level_filter(max));
    }
    Ok(())
}

/// `NativeLog.maxLevel()` to a filter: 0 (or less) is off, 5 (or more) trace.
fn level_filter(max: jint) -> LevelFilter {
    match max {
        i32::MIN..=0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    }
}

/// Clears the re-entrancy flag even if forwarding panics.
struct ForwardingGuard;

impl Drop for ForwardingGuard {
    fn drop(&mut self) {
        FORWARDING.with(|f| f.set(false));
    }
}

impl Log for JavaLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        // The jni crate logs through `log` itself, including from inside the
        // calls this logger makes: forwarding those would loop.
        metadata.level() <= log::max_level() && !metadata.target().starts_with("jni")
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) || FORWARDING.with(|f| f.replace(true)) {
            return;
        }
        let _guard = ForwardingGuard;
        // A record that cannot be delivered is dropped: logging must never
        // turn into an error of the protocol call that logged.
        let _ = self.forward(record);
    }

    fn flush(&self) {}
}

impl JavaLogger {
    fn forward(&self, record: &Record<'_>) -> jni::errors::Result<()> {
        let vm = JavaVM::singleton()?;
        // On a Java thread (every caller of this library) this only pushes a
        // local frame. The default attachment policy also sets aside an
        // exception pending on the thread (e.g. while a panic is being
        // reported) and catches anything the Java side throws.
        vm.attach_current_thread(|env| -> jni::errors::Result<()> {
            // Gone only once the class loader was collected: nobody to tell.
            let Some(class) = self.class.upgrade_local(env)? else {
                return Ok(());
            };
            let target = JString::from_str(env, record.target())?;
            let message = JString::from_str(env, record.args().to_string())?;
            let args = [
                JValue::Int(record.level() as jint).as_jni(),
                JValue::Object(&target).as_jni(),
                JValue::Object(&message).as_jni(),
            ];
            // SAFETY: `method` was looked up on this class with the
            // signature (ILjava/lang/String;Ljava/lang/String;)V, and `args`
            // holds exactly an int and two String references, in that
            // order; the return type given is void. `class` is a live local
            // reference, so the class (and the method id) cannot be unloaded
            // during the call.
            unsafe {
                env.call_static_method_unchecked(
                    &class,
                    self.method,
                    JavaType::Primitive(Primitive::Void),
                    &args,
                )?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_levels_map_to_filters() {
        assert_eq!(level_filter(-1), LevelFilter::Off);
        assert_eq!(level_filter(0), LevelFilter::Off);
        assert_eq!(level_filter(1), LevelFilter::Error);
        assert_eq!(level_filter(3), LevelFilter::Info);
        assert_eq!(level_filter(5), LevelFilter::Trace);
        assert_eq!(level_filter(99), LevelFilter::Trace);
        // The int sent to Java is the `log` crate's own numbering.
        assert_eq!(log::Level::Error as jint, 1);
        assert_eq!(log::Level::Trace as jint, 5);
    }
}
