package io.twopc.flink;

import io.twopc.flink.internal.NativeBridge;

import org.apache.flink.annotation.PublicEvolving;
import org.apache.flink.api.common.serialization.SerializationSchema;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * The settings every twopc sink builder shares: {@link TwopcSinkBuilder} (the Sink V2 sink, for
 * {@code sinkTo}) and, on Flink 1.20, {@code TwopcSinkFunctionBuilder} (the SinkFunction shim, for
 * {@code addSink}). Setters only record values; {@code build()} checks everything at once and
 * reports every problem in one {@link TwopcConfigException}, each with what to change.
 *
 * <p>The rules live once, in the native core: {@code build()} writes the one configuration the
 * task managers will open the sink with and has the core check it, so what {@code build()} accepts
 * is exactly what a subtask accepts. (Where this machine has no native library for its platform,
 * as a client on another operating system may not, the core checks it when the sink opens.) Only
 * what the core never sees, such as the serialization schema and the batch sizes, is checked here.
 *
 * @param <IN> the type of records written
 * @param <SELF> the concrete builder, returned by every setter
 */
@PublicEvolving
public abstract class TwopcSinkBuilderBase<IN, SELF extends TwopcSinkBuilderBase<IN, SELF>> {
    private static final Logger LOG = LoggerFactory.getLogger(TwopcSinkBuilderBase.class);

    /** Defaults. Retention matches the core's default; the rest are sized for typical jobs. */
    public static final int DEFAULT_BATCH_SIZE = 4096;
    public static final int DEFAULT_BATCH_BYTES = 1 << 20;
    public static final Duration DEFAULT_RETENTION = Duration.ofDays(7);
    public static final Duration DEFAULT_RESTART_ALLOWANCE = Duration.ofMinutes(10);
    /** About 71 s of back-off at the default back-off: rides out a destination's failover. */
    public static final int DEFAULT_COMMIT_MAX_ATTEMPTS = 20;
    public static final Duration DEFAULT_COMMIT_INITIAL_BACKOFF = Duration.ofMillis(100);
    public static final Duration DEFAULT_COMMIT_MAX_BACKOFF = Duration.ofSeconds(5);
    public static final Duration DEFAULT_OWNER_WAIT = Duration.ofSeconds(10);
    public static final Duration DEFAULT_LINEAGE_WAIT = Duration.ofMinutes(2);
    public static final double DEFAULT_TIMEOUT_WARNING_RATIO = 0.8;

    /** Upper bound for one batch: it is a direct buffer held by every subtask. */
    static final int MAX_BATCH_BYTES = 256 << 20;
    static final int MAX_BATCH_SIZE = 10_000_000;

    static final String DEFAULT_PART_PREFIX = "part";
    static final String DEFAULT_PART_SUFFIX = "";

    private static final SecureRandom RANDOM = new SecureRandom();

    String outputDirectory;
    PostgresDestination postgres;
    ObjectStoreDestination objectStore;
    SerializationSchema<IN> serializationSchema;
    String sinkId;
    int batchSize = DEFAULT_BATCH_SIZE;
    int batchBytes = DEFAULT_BATCH_BYTES;
    Duration retention = DEFAULT_RETENTION;
    Duration restartAllowance = DEFAULT_RESTART_ALLOWANCE;
    Duration checkpointInterval;
    RewindPolicy rewindPolicy = RewindPolicy.FAIL;
    FreshStartPolicy freshStartPolicy = FreshStartPolicy.FAIL;
    String partPrefix = DEFAULT_PART_PREFIX;
    String partSuffix = DEFAULT_PART_SUFFIX;
    RecordFormat recordFormat = RecordFormat.LINES;
    IoMode ioMode = IoMode.AUTO;
    CommitOrder commitOrder = CommitOrder.DURABLE_FIRST;
    int commitMaxAttempts = DEFAULT_COMMIT_MAX_ATTEMPTS;
    Duration commitInitialBackoff = DEFAULT_COMMIT_INITIAL_BACKOFF;
    Duration commitMaxBackoff = DEFAULT_COMMIT_MAX_BACKOFF;
    Duration ownerWait = DEFAULT_OWNER_WAIT;
    Duration lineageWait = DEFAULT_LINEAGE_WAIT;
    double timeoutWarningRatio = DEFAULT_TIMEOUT_WARNING_RATIO;

    TwopcSinkBuilderBase() {}

    /** This builder, typed as the concrete one. */
    protected abstract SELF self();

    /**
     * The directory committed files go to: an absolute local or mounted path (or a {@code file:}
     * URI). Visible output is {@code <dir>/<prefix>-<transaction id><suffix>}; staging and commit
     * records live under {@code <dir>/_twopc/<sink id>/}, which file readers skip.
     */
    public SELF forDirectory(String directory) {
        this.outputDirectory = directory;
        return self();
    }

    /** See {@link #forDirectory(String)}. */
    public SELF forDirectory(Path directory) {
        this.outputDirectory = directory == null ? null : directory.toString();
        return self();
    }

    /**
     * Writes to an S3-compatible object store instead of a directory: see {@link
     * ObjectStoreDestination}. {@code forDirectory("s3://bucket/prefix")} does the same with AWS's
     * defaults.
     */
    public SELF forObjectStore(ObjectStoreDestination destination) {
        this.objectStore = destination;
        return self();
    }

    /**
     * Writes to a PostgreSQL table instead of a directory: see {@link PostgresDestination} for the
     * settings and {@link PostgresMode} for the two modes. Each record must serialize to one COPY
     * row of the destination's columns, e.g. with {@link CsvRowSchema}.
     */
    public SELF forPostgres(PostgresDestination destination) {
        this.postgres = destination;
        return self();
    }

    /** Turns each record into bytes. Required. */
    public SELF setSerializationSchema(SerializationSchema<IN> schema) {
        this.serializationSchema = schema;
        return self();
    }

    /**
     * The stable name of this sink: 1 to 64 of {@code [A-Za-z0-9_-]}, starting with a letter or
     * digit. It scopes everything the sink owns at the destination and is written into every
     * transaction id, so it must stay the same across restarts and savepoint restores. Two sinks
     * writing to one destination at the same time need different ids. Required.
     */
    public SELF setSinkId(String sinkId) {
        this.sinkId = sinkId;
        return self();
    }

    /** Records per native write call (one JNI crossing per batch). */
    public SELF setBatchSize(int records) {
        this.batchSize = records;
        return self();
    }

    /** Bytes per native write call; also the size of each subtask's direct batch buffer. */
    public SELF setBatchBytes(int bytes) {
        this.batchBytes = bytes;
        return self();
    }

    /**
     * How long the destination keeps a staged transaction before cleanup removes it: the
     * destination's transaction timeout (default 7 days). It must outlast two checkpoint
     * intervals plus a restart ({@link #setRestartAllowance}), or a routine restart would find its
     * prepared transactions gone and stop with data loss; the sink refuses such a setting.
     */
    public SELF setRetention(Duration retention) {
        this.retention = retention;
        return self();
    }

    /** How long a restart may take, for the retention check (default 10 minutes). */
    public SELF setRestartAllowance(Duration allowance) {
        this.restartAllowance = allowance;
        return self();
    }

    /**
     * The checkpoint interval, for the retention check. Optional: the sink reads the job's (the
     * environment's checkpoint configuration), and the retention must cover the longer of the two.
     * Set it when checkpoints may be rarer than the job's interval (e.g. {@code
     * execution.checkpointing.interval-during-backlog}), or when the sink cannot read the job's.
     */
    public SELF setCheckpointInterval(Duration interval) {
        this.checkpointInterval = interval;
        return self();
    }

    /** What to do when restored from a checkpoint older than already committed output. */
    public SELF setRewindPolicy(RewindPolicy policy) {
        this.rewindPolicy = policy;
        return self();
    }

    /**
     * What to do when a start without state finds prepared transactions of another run, or output
     * of earlier runs (see {@link FreshStartPolicy}).
     */
    public SELF setFreshStartPolicy(FreshStartPolicy policy) {
        this.freshStartPolicy = policy;
        return self();
    }

    /** Start of committed file names (default {@code part}): 1 to 32 of {@code [A-Za-z0-9_-]}. */
    public SELF setPartPrefix(String prefix) {
        this.partPrefix = prefix;
        return self();
    }

    /** End of committed file names, e.g. {@code .txt}; empty (the default) or a dot and 1 to 16 of {@code [A-Za-z0-9_-]}. */
    public SELF setPartSuffix(String suffix) {
        this.partSuffix = suffix;
        return self();
    }

    /** {@link RecordFormat#LINES} (default) or {@link RecordFormat#RAW}. */
    public SELF setRecordFormat(RecordFormat format) {
        this.recordFormat = format;
        return self();
    }

    /** How a directory sink writes staged data: {@link IoMode#AUTO} (default), DIRECT or BUFFERED. */
    public SELF setIoMode(IoMode mode) {
        this.ioMode = mode;
        return self();
    }

    /**
     * When a directory sink's commits show their output: {@link CommitOrder#DURABLE_FIRST} (default)
     * or {@link CommitOrder#VISIBLE_FIRST} (at once, made durable after; read its documentation for
     * what a power loss can take back).
     */
    public SELF setCommitOrder(CommitOrder order) {
        this.commitOrder = order;
        return self();
    }

    /**
     * Attempts of a commit whose outcome is unknown (a timeout, a lost connection) before the job
     * stops with an unresolved commit (default 20: about 71 s of back-off at the default back-off,
     * enough to ride out a database's failover; 1 means no retry). Retries use the same
     * transaction id, so a commit that did land is recognised.
     */
    public SELF setCommitMaxAttempts(int attempts) {
        this.commitMaxAttempts = attempts;
        return self();
    }

    /** Backoff between commit retries: doubles from {@code initial}, capped at {@code max}. */
    public SELF setCommitRetryBackoff(Duration initial, Duration max) {
        this.commitInitialBackoff = initial;
        this.commitMaxBackoff = max;
        return self();
    }

    /**
     * How long a starting subtask waits for an earlier attempt of the same job, still shutting
     * down, to release its share of the destination (default 10 s). Another job holding it is
     * waited for as long, then refused.
     */
    public SELF setOwnerWait(Duration wait) {
        this.ownerWait = wait;
        return self();
    }

    /**
     * How long a subtask that a restore gave no share of the sink's state waits for the subtasks
     * that have one to record the run's lineage (default 2 min). After a restore at a higher
     * parallelism the new subtasks start without state and find the lineage within moments; when
     * no subtask has state (the sink's state was dropped, or the savepoint holds another kind of
     * sink's state) the wait runs out, and the sink goes on as a fresh start would: with prepared
     * transactions of this sink at the destination, by its fresh-start policy. A shorter wait
     * reports such a restore sooner, but must outlast the slowest subtask's start.
     */
    public SELF setLineageWait(Duration wait) {
        this.lineageWait = wait;
        return self();
    }

    /**
     * Share of the retention after which a prepared transaction still waiting for its checkpoint
     * to complete is logged as a warning (default 0.8).
     */
    public SELF setTimeoutWarningRatio(double ratio) {
        this.timeoutWarningRatio = ratio;
        return self();
    }

    /**
     * Checks every setting and returns the options, or throws one {@link TwopcConfigException}
     * listing each problem. {@code what} names the built class in the message.
     */
    final TwopcSinkOptions buildOptions(String what) {
        List<String> problems = new ArrayList<>();
        String directory = null;
        ObjectStoreDestination store = objectStore;
        String location = outputDirectory;
        if (store == null && ObjectStoreDestination.isObjectStoreUrl(location)) {
            // s3://bucket/prefix where a directory goes: the object store with AWS's defaults.
            store = ObjectStoreDestination.s3(location);
            location = null;
        }
        if (store != null && (location != null || postgres != null)) {
            problems.add("an object store and " + (postgres != null ? "a PostgreSQL destination" : "an output "
                    + "directory") + " are both set; a sink writes to one: call one of forObjectStore(...), "
                    + "forDirectory(...) and forPostgres(...)");
        } else if (store != null) {
            problems.addAll(store.problems());
            if (ioMode != null && ioMode != IoMode.AUTO) {
                problems.add("I/O mode applies to a directory only, not to an object store; remove setIoMode(...)");
            }
            if (commitOrder != null && commitOrder != CommitOrder.DURABLE_FIRST) {
                problems.add("commit order applies to a directory only, not to an object store (an object "
                        + "becomes visible when its upload completes); remove setCommitOrder(...)");
            }
        } else if (outputDirectory != null && postgres != null) {
            problems.add("both an output directory and a PostgreSQL destination are set; a sink writes to "
                    + "one: call either forDirectory(...) or forPostgres(...)");
        } else if (postgres != null) {
            problems.addAll(postgres.problems());
            problems.addAll(directoryOnlySettingsFor("a PostgreSQL destination"));
            if (serializationSchema instanceof CsvRowSchema
                    && postgres.copyFormat() == PostgresCopyFormat.TEXT) {
                problems.add("the serialization schema is a CsvRowSchema but the PostgreSQL COPY format is "
                        + "TEXT; use copyFormat(PostgresCopyFormat.CSV) (the default)");
            }
        } else if (outputDirectory == null || outputDirectory.trim().isEmpty()) {
            problems.add("output directory is not set; call forDirectory(\"/absolute/path\"), or "
                    + "forPostgres(PostgresDestination.url(...)...) to write to a PostgreSQL table");
        } else {
            try {
                directory = normalizeDirectory(outputDirectory);
            } catch (IllegalArgumentException e) {
                problems.add(e.getMessage());
            }
        }
        if (serializationSchema == null) {
            problems.add("serialization schema is not set; call setSerializationSchema(...), "
                    + "e.g. new SimpleStringSchema() for String records");
        }
        if (sinkId == null || sinkId.isEmpty()) {
            problems.add("sink id is not set; set it with setSinkId(\"my-sink\"); keep it the same across "
                    + "restores");
        }
        if (batchSize <= 0 || batchSize > MAX_BATCH_SIZE) {
            problems.add("batch size " + batchSize + " must be between 1 and " + MAX_BATCH_SIZE
                    + " records; setBatchSize(" + DEFAULT_BATCH_SIZE + ") is the default");
        }
        if (batchBytes <= 0 || batchBytes > MAX_BATCH_BYTES) {
            problems.add("batch bytes " + batchBytes + " must be between 1 and " + MAX_BATCH_BYTES
                    + " (256 MiB: every subtask holds a direct buffer of this size); "
                    + "setBatchBytes(" + DEFAULT_BATCH_BYTES + ") is the default");
        }
        if (!(timeoutWarningRatio >= 0.0 && timeoutWarningRatio <= 1.0)) {
            problems.add("timeout warning ratio " + timeoutWarningRatio + " must be in [0, 1], e.g. 0.8");
        }
        Object[][] required = {
            {"retention", retention}, {"restart allowance", restartAllowance},
            {"rewind policy (use RewindPolicy.FAIL, the default, or RewindPolicy.REPLACE_RANGE)", rewindPolicy},
            {"fresh-start policy (use FreshStartPolicy.FAIL, the default, FreshStartPolicy.ABORT_PREPARED, "
                    + "FreshStartPolicy.APPEND or FreshStartPolicy.APPEND_AND_ABORT_PREPARED)", freshStartPolicy},
            {"record format (use RecordFormat.LINES, the default, or RecordFormat.RAW)", recordFormat},
            {"I/O mode (use IoMode.AUTO, the default, IoMode.DIRECT or IoMode.BUFFERED)", ioMode},
            {"commit order (use CommitOrder.DURABLE_FIRST, the default, or CommitOrder.VISIBLE_FIRST)",
                    commitOrder},
            {"part prefix", partPrefix},
            {"part suffix (use \"\" for none)", partSuffix}, {"commit initial backoff", commitInitialBackoff},
            {"commit max backoff", commitMaxBackoff}, {"owner wait", ownerWait}, {"lineage wait", lineageWait},
        };
        for (Object[] r : required) {
            if (r[1] == null) {
                problems.add(r[0] + " is null");
            }
        }
        for (Object[] d : new Object[][] {
            {"retention", retention}, {"restart allowance", restartAllowance},
            {"checkpoint interval", checkpointInterval}, {"commit initial backoff", commitInitialBackoff},
            {"commit max backoff", commitMaxBackoff}, {"owner wait", ownerWait}, {"lineage wait", lineageWait}}) {
            if (d[1] != null && ((Duration) d[1]).isNegative()) {
                problems.add(d[0] + " " + d[1] + " is negative; give zero or more");
            } else if (d[1] != null && ((Duration) d[1]).getSeconds() > Long.MAX_VALUE / 1000 - 1) {
                problems.add(d[0] + " " + d[1] + " is too large to count in milliseconds");
            }
        }
        if (checkpointInterval != null && checkpointInterval.isZero()) {
            problems.add("checkpoint interval must be at least 1 ms; leave it unset to use the job's");
        }
        if (commitMaxAttempts < 1) {
            problems.add("commit max attempts must be at least 1 (the first attempt counts), not "
                    + commitMaxAttempts + "; setCommitMaxAttempts(" + DEFAULT_COMMIT_MAX_ATTEMPTS + ") is the default");
        }
        if (retention != null && restartAllowance != null && !retention.isNegative() && !retention.isZero()
                && retention.compareTo(restartAllowance) <= 0) {
            // Whatever the checkpoint interval, a restart may take the whole allowance after two
            // intervals: the native side refuses it at open; said here, before the job is submitted.
            problems.add("retention " + Durations.format(retention.toMillis()) + " is not longer than the restart "
                    + "allowance (" + Durations.format(restartAllowance.toMillis()) + "): it must cover two "
                    + "checkpoint intervals plus the allowance. Raise it with setRetention(...)");
        }
        if (postgres != null && rewindPolicy == RewindPolicy.REPLACE_RANGE
                && postgres.mode() == PostgresMode.IDEMPOTENT) {
            problems.add("the rewind policy REPLACE_RANGE applies to PostgreSQL's transactional mode only (in "
                    + "idempotent mode a replay rewrites the same keys, so there is no rewind to repair); use "
                    + "RewindPolicy.FAIL");
        }
        if (problems.isEmpty()) {
            TwopcSinkOptions options = new TwopcSinkOptions(this, directory, store, RANDOM.nextLong());
            validateNatively(options, problems);
            if (problems.isEmpty()) {
                return options;
            }
        }
        StringBuilder message = new StringBuilder("cannot build " + what);
        if (sinkId != null) {
            message.append(" '").append(sinkId).append('\'');
        }
        message.append(": ");
        for (int i = 0; i < problems.size(); i++) {
            message.append(problems.size() > 1 ? "\n  (" + (i + 1) + ") " : "").append(problems.get(i));
        }
        throw new TwopcConfigException(message.toString());
    }

    /** The core's own checks of the configuration (see the class comment). */
    private static void validateNatively(TwopcSinkOptions options, List<String> problems) {
        if (!NativeBridge.isLoaded()) {
            LOG.info("twopc: the native library is not available on this machine ({} {}); the sink's "
                    + "configuration is checked when its subtasks open instead", System.getProperty("os.name"),
                    System.getProperty("os.arch"));
            return;
        }
        try {
            NativeBridge.validate(options.toConfigJson());
        } catch (TwopcConfigException e) {
            String prefix = "invalid twopc configuration: ";
            String m = e.getMessage();
            problems.add(m.startsWith(prefix) ? m.substring(prefix.length()) : m);
        }
    }

    /**
     * The file-name settings mean nothing to a table; a changed one is a sign that the
     * configuration was meant for a directory, so it is reported rather than ignored.
     */
    private List<String> directoryOnlySettingsFor(String destination) {
        List<String> problems = new ArrayList<>();
        if (!DEFAULT_PART_PREFIX.equals(partPrefix)) {
            problems.add("part prefix applies to forDirectory only, not to " + destination + "; remove "
                    + "setPartPrefix(...)");
        }
        if (partSuffix != null && !DEFAULT_PART_SUFFIX.equals(partSuffix)) {
            problems.add("part suffix applies to forDirectory only, not to " + destination + "; remove "
                    + "setPartSuffix(...)");
        }
        if (recordFormat != null && recordFormat != RecordFormat.LINES) {
            problems.add("record format applies to forDirectory only, not to " + destination + " (each record "
                    + "is one COPY row there); remove setRecordFormat(...)");
        }
        if (ioMode != null && ioMode != IoMode.AUTO) {
            problems.add("I/O mode applies to forDirectory only, not to " + destination + "; remove "
                    + "setIoMode(...)");
        }
        if (commitOrder != null && commitOrder != CommitOrder.DURABLE_FIRST) {
            problems.add("commit order applies to forDirectory only, not to " + destination + "; remove "
                    + "setCommitOrder(...)");
        }
        return problems;
    }

    /**
     * Accepts a plain path or a {@code file:} URI and returns the path (a conversion, not a rule:
     * the core decides what paths it accepts).
     */
    static String normalizeDirectory(String raw) {
        String value = raw.trim();
        int colon = value.indexOf(':');
        int slash = value.indexOf('/');
        boolean hasScheme = colon > 1 && (slash < 0 || colon < slash);
        if (!hasScheme) {
            // Lexical clean-up only ("/a/./b/../c/" is "/a/c"); whether the path is acceptable
            // (absolute, not the root) is the core's rule.
            try {
                Path path = Paths.get(value).normalize();
                return path.toString().isEmpty() ? value : path.toString();
            } catch (InvalidPathException e) {
                throw new IllegalArgumentException("output directory \"" + raw + "\" is not a valid path: "
                        + e.getMessage());
            }
        }
        try {
            URI uri = new URI(value);
            if (!"file".equalsIgnoreCase(uri.getScheme())) {
                throw new IllegalArgumentException("output directory \"" + raw + "\" uses the scheme '"
                        + uri.getScheme() + "'; this sink writes to a local or mounted filesystem, or to an "
                        + "S3-compatible object store (s3://bucket/prefix): give an absolute path such as "
                        + "/mnt/data/out, or an s3:// URL");
            }
            if (uri.getAuthority() != null && !uri.getAuthority().isEmpty()) {
                throw new IllegalArgumentException("output directory \"" + raw + "\" names a host ("
                        + uri.getAuthority() + "); use file:///absolute/path or a plain absolute path");
            }
            Path path = Paths.get(uri).normalize();
            return path.toString();
        } catch (URISyntaxException | InvalidPathException e) {
            throw new IllegalArgumentException("output directory \"" + raw + "\" is not a valid path: "
                    + e.getMessage());
        }
    }
}
