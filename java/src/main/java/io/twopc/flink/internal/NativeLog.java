package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;

import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Receives the Rust library's log records (called from native code) and
 * passes them to SLF4J, so they appear in Flink's log with Flink's levels.
 *
 * <p>Logger names are {@code twopc.} plus the Rust target with {@code ::}
 * turned into dots: the core's {@code twopc_core::sink} logs as {@code
 * twopc.core.sink}, the bridge as {@code twopc.jni}. The level of logger
 * {@code twopc} when the library loads caps what Rust forwards at all
 * (records below it cost nothing); set it to DEBUG to see the core's debug
 * output.
 */
@Internal
public final class NativeLog {
    /** Parent of every logger used for native records. */
    public static final String ROOT = "twopc";

    private static final ConcurrentMap<String, Logger> LOGGERS = new ConcurrentHashMap<>();

    private NativeLog() {}

    /**
     * The most detailed level enabled for {@link #ROOT}, in the Rust
     * numbering: 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace. Read once
     * by the native library when it loads.
     */
    static int maxLevel() {
        Logger logger = LoggerFactory.getLogger(ROOT);
        if (logger.isTraceEnabled()) {
            return 5;
        }
        if (logger.isDebugEnabled()) {
            return 4;
        }
        if (logger.isInfoEnabled()) {
            return 3;
        }
        if (logger.isWarnEnabled()) {
            return 2;
        }
        return logger.isErrorEnabled() ? 1 : 0;
    }

    /**
     * One record from Rust. Never throws: an exception here would surface in
     * the native call that happened to log.
     */
    static void log(int level, String target, String message) {
        try {
            Logger logger = LOGGERS.computeIfAbsent(target == null ? "" : target, t -> LoggerFactory.getLogger(loggerName(t)));
            switch (level) {
                case 1:
                    logger.error(message);
                    break;
                case 2:
                    logger.warn(message);
                    break;
                case 3:
                    logger.info(message);
                    break;
                case 4:
                    logger.debug(message);
                    break;
                default:
                    logger.trace(message);
                    break;
            }
        } catch (Throwable ignored) {
            // A broken logging backend must not fail the sink.
        }
    }

    /** {@code twopc_core::sink} → {@code twopc.core.sink}; {@code twopc::jni} → {@code twopc.jni}. */
    static String loggerName(String target) {
        String name = target.replace("::", ".");
        if (name.equals(ROOT) || name.startsWith(ROOT + ".")) {
            return name;
        }
        if (name.startsWith(ROOT + "_")) {
            return ROOT + "." + name.substring(ROOT.length() + 1);
        }
        return name.isEmpty() ? ROOT : ROOT + "." + name;
    }
}
