package io.twopc.flink;

import org.apache.flink.api.common.serialization.SerializationSchema;

import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.InvalidPathException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.regex.Pattern;

/**
 * Builds a {@link TwopcSink}, in the style of Flink's {@code FileSink} and {@code KafkaSink}
 * builders:
 *
 * <pre>{@code
 * TwopcSink<String> sink = TwopcSink.<String>builder()
 *         .forDirectory("/data/out/orders")
 *         .setSinkId("orders")
 *         .setSerializationSchema(new SimpleStringSchema())
 *         .build();
 * stream.addSink(sink).uid("orders-sink");
 * }</pre>
 *
 * <p>The destination is a directory ({@link #forDirectory(String)}) or a PostgreSQL table
 * ({@link #forPostgres(PostgresDestination)}); exactly one of them.
 *
 * <p>Setters only record values; {@link #build()} checks everything at once and reports every
 * problem in one {@link TwopcConfigException}, each with what to change. The sink id and the
 * destination must stay the same across restarts and savepoint restores of the job.
 */
public final class TwopcSinkBuilder<IN> {
    /** Defaults. Retention matches the core's default; the rest are sized for typical jobs. */
    public static final int DEFAULT_BATCH_SIZE = 4096;
    public static final int DEFAULT_BATCH_BYTES = 1 << 20;
    public static final Duration DEFAULT_RETENTION = Duration.ofDays(7);
    public static final Duration DEFAULT_RESTART_ALLOWANCE = Duration.ofMinutes(10);
    public static final int DEFAULT_COMMIT_MAX_ATTEMPTS = 5;
    public static final Duration DEFAULT_COMMIT_INITIAL_BACKOFF = Duration.ofMillis(100);
    public static final Duration DEFAULT_COMMIT_MAX_BACKOFF = Duration.ofSeconds(5);
    public static final double DEFAULT_TIMEOUT_WARNING_RATIO = 0.8;

    /** Upper bound for one batch: it is a direct buffer held by every subtask. */
    static final int MAX_BATCH_BYTES = 256 << 20;
    static final int MAX_BATCH_SIZE = 10_000_000;
    static final int MAX_COMMIT_ATTEMPTS = 1000;

    static final int MAX_SINK_ID_LENGTH = 64;
    static final int MAX_PART_PREFIX_LENGTH = 32;
    static final int MAX_PART_SUFFIX_LENGTH = 16;

    /**
     * The characters the core lets into file names (and other destinations' identifiers): no
     * separators, no dots, no quotes, and no leading {@code _}/{@code -} (hidden or option-like).
     */
    private static final Pattern TOKEN = Pattern.compile("[A-Za-z0-9][A-Za-z0-9_-]*");

    static final String DEFAULT_PART_PREFIX = "part";
    static final String DEFAULT_PART_SUFFIX = "";

    private String outputDirectory;
    private PostgresDestination postgres;
    private SerializationSchema<IN> serializationSchema;
    private String sinkId;
    private int batchSize = DEFAULT_BATCH_SIZE;
    private int batchBytes = DEFAULT_BATCH_BYTES;
    private Duration retention = DEFAULT_RETENTION;
    private Duration restartAllowance = DEFAULT_RESTART_ALLOWANCE;
    private Duration checkpointInterval;
    private RewindPolicy rewindPolicy = RewindPolicy.FAIL;
    private FreshStartPolicy freshStartPolicy = FreshStartPolicy.FAIL;
    private String partPrefix = DEFAULT_PART_PREFIX;
    private String partSuffix = DEFAULT_PART_SUFFIX;
    private RecordFormat recordFormat = RecordFormat.LINES;
    private int commitMaxAttempts = DEFAULT_COMMIT_MAX_ATTEMPTS;
    private Duration commitInitialBackoff = DEFAULT_COMMIT_INITIAL_BACKOFF;
    private Duration commitMaxBackoff = DEFAULT_COMMIT_MAX_BACKOFF;
    private double timeoutWarningRatio = DEFAULT_TIMEOUT_WARNING_RATIO;

    TwopcSinkBuilder() {}

    /**
     * The directory committed files go to: an absolute local or mounted path (or a {@code file:}
     * URI). Visible output is {@code <dir>/<prefix>-<transaction id><suffix>}; staging and commit
     * records live under {@code <dir>/_twopc/<sink id>/}, which file readers skip.
     */
    public TwopcSinkBuilder<IN> forDirectory(String directory) {
        this.outputDirectory = directory;
        return this;
    }

    /** See {@link #forDirectory(String)}. */
    public TwopcSinkBuilder<IN> forDirectory(Path directory) {
        this.outputDirectory = directory == null ? null : directory.toString();
        return this;
    }

    /**
     * Writes to a PostgreSQL table instead of a directory: see {@link PostgresDestination} for the
     * settings and {@link PostgresMode} for the two modes. Each record must serialize to one COPY
     * row of the destination's columns, e.g. with {@link CsvRowSchema}.
     */
    public TwopcSinkBuilder<IN> forPostgres(PostgresDestination destination) {
        this.postgres = destination;
        return this;
    }

    /** Turns each record into bytes. Required. */
    public TwopcSinkBuilder<IN> setSerializationSchema(SerializationSchema<IN> schema) {
        this.serializationSchema = schema;
        return this;
    }

    /**
     * The stable name of this sink: 1 to 64 of {@code [A-Za-z0-9_-]}, starting with a letter or
     * digit. It scopes everything the sink owns at the destination and is written into every
     * transaction id, so it must not change across restores. Required.
     */
    public TwopcSinkBuilder<IN> setSinkId(String sinkId) {
        this.sinkId = sinkId;
        return this;
    }

    /** Records per native write call (one JNI crossing per batch). */
    public TwopcSinkBuilder<IN> setBatchSize(int records) {
        this.batchSize = records;
        return this;
    }

    /** Bytes per native write call; also the size of each subtask's direct batch buffer. */
    public TwopcSinkBuilder<IN> setBatchBytes(int bytes) {
        this.batchBytes = bytes;
        return this;
    }

    /**
     * How long staged transactions are kept before cleanup removes them: the destination's
     * transaction timeout (on PostgreSQL, how long a transaction may stay prepared before the sink
     * rolls it back). A prepared transaction of a completed checkpoint that waits longer than
     * this (a job down for longer) is lost, and the job stops with {@link
     * TwopcLostTransactionException} rather than skip it.
     */
    public TwopcSinkBuilder<IN> setRetention(Duration retention) {
        this.retention = retention;
        return this;
    }

    /**
     * How long a restart may take, at most, in normal operation. Retention must cover two
     * checkpoint intervals plus this, or a routine restart could find its transactions expired.
     */
    public TwopcSinkBuilder<IN> setRestartAllowance(Duration allowance) {
        this.restartAllowance = allowance;
        return this;
    }

    /**
     * The job's checkpoint interval, for the retention check. The sink reads the interval from
     * the job configuration at runtime when it can; this value is used only when it cannot, and
     * lets {@link #build()} check the retention early.
     */
    public TwopcSinkBuilder<IN> setCheckpointInterval(Duration interval) {
        this.checkpointInterval = interval;
        return this;
    }

    /** What to do when restored from a checkpoint older than already committed output. */
    public TwopcSinkBuilder<IN> setRewindPolicy(RewindPolicy policy) {
        this.rewindPolicy = policy;
        return this;
    }

    /** What to do when a stateless start finds prepared transactions of another run. */
    public TwopcSinkBuilder<IN> setFreshStartPolicy(FreshStartPolicy policy) {
        this.freshStartPolicy = policy;
        return this;
    }

    /** Start of committed file names (default {@code part}): 1 to 32 of {@code [A-Za-z0-9_-]}. */
    public TwopcSinkBuilder<IN> setPartPrefix(String prefix) {
        this.partPrefix = prefix;
        return this;
    }

    /** End of committed file names, e.g. {@code .txt}; empty (the default) or a dot and 1 to 16 of {@code [A-Za-z0-9_-]}. */
    public TwopcSinkBuilder<IN> setPartSuffix(String suffix) {
        this.partSuffix = suffix;
        return this;
    }

    /** {@link RecordFormat#LINES} (default) or {@link RecordFormat#RAW}. */
    public TwopcSinkBuilder<IN> setRecordFormat(RecordFormat format) {
        this.recordFormat = format;
        return this;
    }

    /**
     * How often a commit whose outcome is unknown (an I/O error) is retried by transaction id
     * before the job is stopped with {@link TwopcUnresolvedCommitException}.
     */
    public TwopcSinkBuilder<IN> setCommitMaxAttempts(int attempts) {
        this.commitMaxAttempts = attempts;
        return this;
    }

    /** Backoff between commit retries: doubles from {@code initial}, capped at {@code max}. */
    public TwopcSinkBuilder<IN> setCommitRetryBackoff(Duration initial, Duration max) {
        this.commitInitialBackoff = initial;
        this.commitMaxBackoff = max;
        return this;
    }

    /**
     * Warn when a transaction waiting for its commit has used this fraction of the retention
     * (default 0.8), in [0, 1].
     */
    public TwopcSinkBuilder<IN> setTimeoutWarningRatio(double ratio) {
        this.timeoutWarningRatio = ratio;
        return this;
    }

    /**
     * Validates every setting and builds the sink.
     *
     * @throws TwopcConfigException listing each setting that cannot work and what to change
     */
    public TwopcSink<IN> build() {
        List<String> problems = new ArrayList<>();

        String sinkIdProblem = checkToken("sink id", sinkId, MAX_SINK_ID_LENGTH,
                "set it with setSinkId(\"my-sink\"); keep it the same across restores");
        if (sinkIdProblem != null) {
            problems.add(sinkIdProblem);
        }

        String directory = null;
        if (outputDirectory != null && postgres != null) {
            problems.add("both an output directory and a PostgreSQL destination are set; a sink writes to "
                    + "one: call either forDirectory(...) or forPostgres(...)");
        } else if (postgres != null) {
            problems.addAll(postgres.problems());
            problems.addAll(directoryOnlySettingsFor("a PostgreSQL destination"));
            if (rewindPolicy == RewindPolicy.REPLACE_RANGE && postgres.mode() == PostgresMode.TRANSACTIONAL
                    && postgres.transactionIdColumn() == null) {
                // Without it a retraction cannot tell this transaction's rows from any other's,
                // and a restore that needs one would fail over and over.
                problems.add("RewindPolicy.REPLACE_RANGE on PostgreSQL needs a transaction id column to find "
                        + "the rows to remove; add a text column to the table and set "
                        + "transactionIdColumn(\"...\"), or keep RewindPolicy.FAIL");
            }
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

        if (batchSize <= 0 || batchSize > MAX_BATCH_SIZE) {
            problems.add("batch size " + batchSize + " must be between 1 and " + MAX_BATCH_SIZE
                    + " records; setBatchSize(" + DEFAULT_BATCH_SIZE + ") is the default");
        }
        if (batchBytes <= 0 || batchBytes > MAX_BATCH_BYTES) {
            problems.add("batch bytes " + batchBytes + " must be between 1 and " + MAX_BATCH_BYTES
                    + " (256 MiB: every subtask holds a direct buffer of this size); "
                    + "setBatchBytes(" + DEFAULT_BATCH_BYTES + ") is the default");
        }

        long retentionMs = positiveMillis("retention", retention, problems);
        long allowanceMs = nonNegativeMillis("restart allowance", restartAllowance, problems);
        long intervalMs = 0;
        if (checkpointInterval != null) {
            intervalMs = positiveMillis("checkpoint interval", checkpointInterval, problems);
        }
        if (retentionMs > 0 && allowanceMs >= 0 && intervalMs > 0) {
            long needed = saturatingAdd(saturatingMultiply(intervalMs, 2), allowanceMs);
            if (retentionMs < needed) {
                problems.add("retention of " + retentionMs + " ms is shorter than two checkpoint "
                        + "intervals (" + intervalMs + " ms each) plus the restart allowance of "
                        + allowanceMs + " ms = " + needed + " ms: a normal restart would find its "
                        + "prepared transactions expired and stop with data loss. Raise the "
                        + "retention to at least " + needed + " ms (setRetention), or checkpoint "
                        + "more often");
            }
        }

        if (rewindPolicy == null) {
            problems.add("rewind policy is null; use RewindPolicy.FAIL or RewindPolicy.REPLACE_RANGE");
        }
        if (freshStartPolicy == null) {
            problems.add("fresh-start policy is null; use FreshStartPolicy.FAIL or "
                    + "FreshStartPolicy.ABORT_PREPARED");
        }
        if (recordFormat == null) {
            problems.add("record format is null; use RecordFormat.LINES or RecordFormat.RAW");
        }

        // With a PostgreSQL destination the file-name settings were checked above.
        String prefixProblem = postgres != null ? null
                : checkToken("part prefix", partPrefix, MAX_PART_PREFIX_LENGTH, "e.g. setPartPrefix(\"part\")");
        if (prefixProblem != null) {
            problems.add(prefixProblem);
        }
        if (partSuffix == null) {
            problems.add("part suffix is null; use \"\" for none or e.g. \".txt\"");
        } else if (!partSuffix.isEmpty() && postgres == null) {
            if (!partSuffix.startsWith(".")) {
                problems.add("part suffix \"" + partSuffix + "\" must start with '.', e.g. \".txt\"");
            } else {
                String suffixProblem = checkToken("part suffix (after the dot)",
                        partSuffix.substring(1), MAX_PART_SUFFIX_LENGTH, "e.g. setPartSuffix(\".txt\")");
                if (suffixProblem != null) {
                    problems.add(suffixProblem);
                }
            }
        }

        if (commitMaxAttempts < 1 || commitMaxAttempts > MAX_COMMIT_ATTEMPTS) {
            problems.add("commit max attempts " + commitMaxAttempts + " must be between 1 and "
                    + MAX_COMMIT_ATTEMPTS + " (1 means no retry)");
        }
        long initialBackoffMs = nonNegativeMillis("commit initial backoff", commitInitialBackoff, problems);
        long maxBackoffMs = nonNegativeMillis("commit max backoff", commitMaxBackoff, problems);
        if (initialBackoffMs >= 0 && maxBackoffMs >= 0 && maxBackoffMs < initialBackoffMs) {
            problems.add("commit max backoff (" + maxBackoffMs + " ms) is below the initial backoff ("
                    + initialBackoffMs + " ms); raise the maximum or lower the initial backoff");
        }

        if (!(timeoutWarningRatio >= 0.0 && timeoutWarningRatio <= 1.0)) {
            problems.add("timeout warning ratio " + timeoutWarningRatio + " must be in [0, 1], e.g. 0.8");
        }

        if (!problems.isEmpty()) {
            StringBuilder message = new StringBuilder("cannot build TwopcSink");
            if (sinkIdProblem == null) {
                message.append(" '").append(sinkId).append('\'');
            }
            message.append(": ");
            for (int i = 0; i < problems.size(); i++) {
                message.append(problems.size() > 1 ? "\n  (" + (i + 1) + ") " : "").append(problems.get(i));
            }
            throw new TwopcConfigException(message.toString());
        }

        TwopcSinkOptions options = new TwopcSinkOptions(
                sinkId,
                directory,
                postgres,
                partPrefix,
                partSuffix,
                recordFormat,
                batchSize,
                batchBytes,
                retentionMs,
                allowanceMs,
                intervalMs,
                rewindPolicy,
                freshStartPolicy,
                commitMaxAttempts,
                initialBackoffMs,
                maxBackoffMs,
                timeoutWarningRatio);
        return new TwopcSink<>(options, Objects.requireNonNull(serializationSchema));
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
        return problems;
    }

    /** Returns a problem description, or null when {@code value} is a valid token. */
    private static String checkToken(String what, String value, int maxLength, String hint) {
        if (value == null || value.isEmpty()) {
            return what + " is not set; " + hint;
        }
        if (value.length() > maxLength) {
            return what + " \"" + value + "\" is " + value.length() + " characters long; use at most "
                    + maxLength;
        }
        if (!TOKEN.matcher(value).matches()) {
            char first = value.charAt(0);
            if (first == '_' || first == '-') {
                return what + " \"" + value + "\" must start with a letter or digit (names starting with '"
                        + first + "' are hidden from readers or look like options)";
            }
            for (int i = 0; i < value.length(); i++) {
                char c = value.charAt(i);
                boolean ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
                        || c == '_' || c == '-';
                if (!ok) {
                    return what + " \"" + value + "\" contains '" + c + "'; use only letters, digits, '_' "
                            + "and '-' (it becomes part of file names)";
                }
            }
        }
        return null;
    }

    /** Accepts an absolute path or a {@code file:} URI; returns the normalized absolute path. */
    static String normalizeDirectory(String raw) {
        String value = raw.trim();
        if (value.indexOf('\0') >= 0) {
            throw new IllegalArgumentException("output directory contains a NUL character");
        }
        Path path;
        int colon = value.indexOf(':');
        int slash = value.indexOf('/');
        boolean hasScheme = colon > 1 && (slash < 0 || colon < slash);
        try {
            if (hasScheme) {
                URI uri = new URI(value);
                if (!"file".equalsIgnoreCase(uri.getScheme())) {
                    throw new IllegalArgumentException("output directory \"" + raw + "\" uses the scheme '"
                            + uri.getScheme() + "'; this sink writes to a local or mounted filesystem "
                            + "only: give an absolute path such as /mnt/data/out");
                }
                if (uri.getAuthority() != null && !uri.getAuthority().isEmpty()) {
                    throw new IllegalArgumentException("output directory \"" + raw + "\" names a host ("
                            + uri.getAuthority() + "); use file:///absolute/path or a plain absolute path");
                }
                path = Paths.get(uri);
            } else {
                path = Paths.get(value);
            }
        } catch (URISyntaxException | InvalidPathException e) {
            throw new IllegalArgumentException("output directory \"" + raw + "\" is not a valid path: "
                    + e.getMessage());
        }
        if (!path.isAbsolute()) {
            throw new IllegalArgumentException("output directory \"" + raw + "\" is relative; give an "
                    + "absolute path (task managers resolve relative paths against their own working "
                    + "directory, so output would scatter)");
        }
        Path normalized = path.normalize();
        if (normalized.getNameCount() == 0) {
            throw new IllegalArgumentException("output directory \"" + raw + "\" is the filesystem root; "
                    + "give a dedicated directory");
        }
        return normalized.toString();
    }

    private static long positiveMillis(String what, Duration value, List<String> problems) {
        if (value == null) {
            problems.add(what + " is null; give a positive Duration");
            return -1;
        }
        long millis = toMillis(what, value, problems);
        if (millis == -1) {
            return -1;
        }
        if (millis <= 0) {
            problems.add(what + " " + value + " must be at least 1 ms");
            return -1;
        }
        return millis;
    }

    private static long nonNegativeMillis(String what, Duration value, List<String> problems) {
        if (value == null) {
            problems.add(what + " is null; give a Duration (Duration.ZERO for none)");
            return -1;
        }
        if (value.isNegative()) {
            problems.add(what + " " + value + " is negative; give zero or more");
            return -1;
        }
        return toMillis(what, value, problems);
    }

    /** Millis of a non-negative duration, or -1 (with a problem recorded) when it overflows. */
    private static long toMillis(String what, Duration value, List<String> problems) {
        if (value.isNegative()) {
            return 0;
        }
        try {
            return value.toMillis();
        } catch (ArithmeticException e) {
            problems.add(what + " " + value + " is too large to express in milliseconds");
            return -1;
        }
    }

    private static long saturatingAdd(long a, long b) {
        long r = a + b;
        return ((a ^ r) & (b ^ r)) < 0 ? Long.MAX_VALUE : r;
    }

    private static long saturatingMultiply(long a, long b) {
        long hi = Math.multiplyHigh(a, b);
        long lo = a * b;
        return (hi == 0 && lo >= 0) ? lo : Long.MAX_VALUE;
    }
}
