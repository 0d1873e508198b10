package io.twopc.flink.table;

import io.twopc.flink.PostgresDestination;
import io.twopc.flink.TwopcSinkBuilderBase;

import org.apache.flink.annotation.PublicEvolving;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ConfigOptions;
import org.apache.flink.configuration.MemorySize;
import org.apache.flink.table.factories.FactoryUtil;

import java.time.Duration;

/**
 * The options of the twopc SQL connector ({@code 'connector' = 'twopc'}): a table writes either to
 * a directory ({@code 'path'} and {@code 'format'}) or to a PostgreSQL table ({@code 'url'} and
 * {@code 'table-name'}). The README's "Flink SQL" section has the table of options with their
 * defaults; each option's description says the same.
 *
 * <p>Enumerated values are written in lower case with dashes ({@code 'replace-range'}); the Java
 * spelling ({@code REPLACE_RANGE}) is accepted too.
 */
@PublicEvolving
public final class TwopcConnectorOptions {
    private TwopcConnectorOptions() {}

    /** The connector's identifier: {@code 'connector' = 'twopc'}. */
    public static final String IDENTIFIER = "twopc";

    // ------------------------------------------------------------------ every table

    public static final ConfigOption<String> SINK_ID = ConfigOptions.key("sink-id")
            .stringType()
            .noDefaultValue()
            .withDescription("Required. The stable name of this sink: 1 to 64 of [A-Za-z0-9_-], starting with a "
                    + "letter or digit. It is written into every transaction id and scopes what the sink keeps at "
                    + "the destination, so keep it the same across restarts and savepoint restores; two sinks "
                    + "writing to one destination need different ids.");

    /** Flink's own {@code 'sink.parallelism'}. */
    public static final ConfigOption<Integer> SINK_PARALLELISM = FactoryUtil.SINK_PARALLELISM;

    public static final ConfigOption<String> REWIND_POLICY = ConfigOptions.key("sink.rewind-policy")
            .stringType()
            .defaultValue("fail")
            .withDescription("What to do when restored from a checkpoint older than output already committed: "
                    + "'fail' (stop, naming that output) or 'replace-range' (remove it, then replay; on "
                    + "PostgreSQL this needs 'sink.transaction-id-column').");

    public static final ConfigOption<String> FRESH_START_POLICY = ConfigOptions.key("sink.fresh-start-policy")
            .stringType()
            .defaultValue("fail")
            .withDescription("What a start without state does with prepared transactions of another run and with "
                    + "output of earlier runs: 'fail', 'abort-prepared', 'append' or 'append-and-abort-prepared'.");

    public static final ConfigOption<Duration> RETENTION = ConfigOptions.key("sink.retention")
            .durationType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_RETENTION)
            .withDescription("How long a staged transaction is kept before cleanup removes it (the destination's "
                    + "transaction timeout). Must outlast two checkpoint intervals plus 'sink.restart-allowance'.");

    public static final ConfigOption<Duration> RESTART_ALLOWANCE = ConfigOptions.key("sink.restart-allowance")
            .durationType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_RESTART_ALLOWANCE)
            .withDescription("How long a restart may take, for the retention check.");

    public static final ConfigOption<Duration> CHECKPOINT_INTERVAL = ConfigOptions.key("sink.checkpoint-interval")
            .durationType()
            .noDefaultValue()
            .withDescription("A checkpoint interval for the retention check, which covers the longer of this "
                    + "and the job's interval (set it when checkpoints may be rarer, e.g. during backlog). Unset "
                    + "(the default), the sink reads the job's.");

    public static final ConfigOption<Integer> BATCH_SIZE = ConfigOptions.key("sink.batch-size")
            .intType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_BATCH_SIZE)
            .withDescription("Records per native write call (one JNI crossing per batch).");

    public static final ConfigOption<MemorySize> BATCH_BYTES = ConfigOptions.key("sink.batch-bytes")
            .memoryType()
            .defaultValue(new MemorySize(TwopcSinkBuilderBase.DEFAULT_BATCH_BYTES))
            .withDescription("Bytes per native write call; also the size of each subtask's batch buffer "
                    + "(at most 256 mb).");

    public static final ConfigOption<Integer> COMMIT_MAX_ATTEMPTS = ConfigOptions.key("sink.commit.max-attempts")
            .intType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_COMMIT_MAX_ATTEMPTS)
            .withDescription("Attempts of a commit whose outcome is unknown before the job stops (1: no retry). "
                    + "Retries use the same transaction id.");

    public static final ConfigOption<Duration> COMMIT_INITIAL_BACKOFF =
            ConfigOptions.key("sink.commit.initial-backoff")
                    .durationType()
                    .defaultValue(TwopcSinkBuilderBase.DEFAULT_COMMIT_INITIAL_BACKOFF)
                    .withDescription("First wait between commit retries; it doubles up to "
                            + "'sink.commit.max-backoff'.");

    public static final ConfigOption<Duration> COMMIT_MAX_BACKOFF = ConfigOptions.key("sink.commit.max-backoff")
            .durationType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_COMMIT_MAX_BACKOFF)
            .withDescription("Longest wait between commit retries.");

    public static final ConfigOption<Duration> OWNER_WAIT = ConfigOptions.key("sink.owner-wait")
            .durationType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_OWNER_WAIT)
            .withDescription("How long a starting subtask waits for an earlier attempt of the same job to release "
                    + "its share of the destination.");

    public static final ConfigOption<Duration> LINEAGE_WAIT = ConfigOptions.key("sink.lineage-wait")
            .durationType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_LINEAGE_WAIT)
            .withDescription("How long a subtask that a restore gave no share of the sink's state waits for the "
                    + "subtasks that have one to record the run's lineage, before it goes on as a fresh start.");

    public static final ConfigOption<Double> TIMEOUT_WARNING_RATIO = ConfigOptions.key("sink.timeout-warning-ratio")
            .doubleType()
            .defaultValue(TwopcSinkBuilderBase.DEFAULT_TIMEOUT_WARNING_RATIO)
            .withDescription("Share of the retention after which a prepared transaction still waiting for its "
                    + "checkpoint is logged as a warning.");

    // ------------------------------------------------------------------ directory tables

    public static final ConfigOption<String> PATH = ConfigOptions.key("path")
            .stringType()
            .noDefaultValue()
            .withDescription("A directory table: the absolute local or mounted directory committed files go to "
                    + "(or a file:/// URI). Needs 'format'.");

    /** Flink's own {@code 'format'}: any {@code SerializationFormatFactory} (csv, json, raw, ...). */
    public static final ConfigOption<String> FORMAT = FactoryUtil.FORMAT;

    public static final ConfigOption<String> PART_PREFIX = ConfigOptions.key("sink.part-prefix")
            .stringType()
            .defaultValue("part")
            .withDescription("Directory tables: start of committed file names, 1 to 32 of [A-Za-z0-9_-].");

    public static final ConfigOption<String> PART_SUFFIX = ConfigOptions.key("sink.part-suffix")
            .stringType()
            .defaultValue("")
            .withDescription("Directory tables: end of committed file names, e.g. '.csv'; empty or a dot and 1 to "
                    + "16 of [A-Za-z0-9_-].");

    public static final ConfigOption<String> RECORD_FORMAT = ConfigOptions.key("sink.record-format")
            .stringType()
            .defaultValue("lines")
            .withDescription("Directory tables: 'lines' (each record followed by a line feed; a record holding "
                    + "a line feed is refused) or 'raw' (records back to back, as the format wrote them, with no "
                    + "separator: Flink's csv, json and raw formats end a row with none, so 'raw' suits only "
                    + "rows that end in a delimiter of their own).");

    public static final ConfigOption<String> IO_MODE = ConfigOptions.key("sink.io-mode")
            .stringType()
            .defaultValue("auto")
            .withDescription("Directory tables: how staged data is written: 'auto', 'direct' or 'buffered'.");

    public static final ConfigOption<String> COMMIT_ORDER = ConfigOptions.key("sink.commit-order")
            .stringType()
            .defaultValue("durable-first")
            .withDescription("Directory tables: when a commit shows its output: 'durable-first' (after the "
                    + "commit is synced to the device) or 'visible-first' (at once, synced after: a power "
                    + "loss within those milliseconds can take back output readers saw; see CommitOrder).");

    // ------------------------------------------------------------------ object-store tables ('path' = 's3://...')

    public static final ConfigOption<String> S3_ENDPOINT = ConfigOptions.key("s3.endpoint")
            .stringType()
            .noDefaultValue()
            .withDescription("Object-store tables ('path' = 's3://bucket/prefix'): another endpoint than AWS's, "
                    + "an S3-compatible store or a local server.");

    public static final ConfigOption<String> S3_REGION = ConfigOptions.key("s3.region")
            .stringType()
            .noDefaultValue()
            .withDescription("Object-store tables: the region (default us-east-1).");

    public static final ConfigOption<Boolean> S3_PATH_STYLE_ACCESS = ConfigOptions.key("s3.path-style-access")
            .booleanType()
            .defaultValue(false)
            .withDescription("Object-store tables: path-style requests (endpoint/bucket/key), which most "
                    + "S3-compatible and local servers need.");

    public static final ConfigOption<Boolean> S3_ALLOW_HTTP = ConfigOptions.key("s3.allow-http")
            .booleanType()
            .defaultValue(false)
            .withDescription("Object-store tables: permit a plain http:// endpoint (a local test server only).");

    public static final ConfigOption<String> S3_PROFILE = ConfigOptions.key("s3.profile")
            .stringType()
            .noDefaultValue()
            .withDescription("Object-store tables: the AWS profile task managers read when their environment has "
                    + "no keys. Credentials themselves are never table options.");

    public static final ConfigOption<MemorySize> S3_PART_SIZE = ConfigOptions.key("s3.part-size")
            .memoryType()
            .defaultValue(MemorySize.parse("8mb"))
            .withDescription("Object-store tables: bytes per uploaded part, at least 5 MiB.");

    public static final ConfigOption<Duration> SAVEPOINT_RETENTION = ConfigOptions.key("sink.savepoint-retention")
            .durationType()
            .defaultValue(Duration.ZERO)
            .withDescription("Object-store tables: how long savepoints that may be restored are kept; the "
                    + "bucket's lifecycle rules must not abort incomplete uploads sooner.");

    // ------------------------------------------------------------------ PostgreSQL tables

    public static final ConfigOption<String> URL = ConfigOptions.key("url")
            .stringType()
            .noDefaultValue()
            .withDescription("A PostgreSQL table: the server, postgres://user@host:5432/database (also "
                    + "postgresql:// or jdbc:postgresql://), without a password. Needs 'table-name'.");

    public static final ConfigOption<String> TABLE_NAME = ConfigOptions.key("table-name")
            .stringType()
            .noDefaultValue()
            .withDescription("PostgreSQL tables: the target table, 'table' or 'schema.table', case-sensitive. It "
                    + "must exist; the DDL's columns are its columns, by name.");

    public static final ConfigOption<String> USERNAME = ConfigOptions.key("username")
            .stringType()
            .noDefaultValue()
            .withDescription("PostgreSQL tables: the user, when the URL does not name one.");

    public static final ConfigOption<String> PASSWORD = ConfigOptions.key("password")
            .stringType()
            .noDefaultValue()
            .withDescription("PostgreSQL tables: the password. Flink masks this option in logs and the web UI; "
                    + "it travels to the task managers with the job, as in Flink's JDBC connector. Prefer "
                    + "'password-env', which keeps it out of the table's definition.");

    public static final ConfigOption<String> PASSWORD_ENV = ConfigOptions.key("password-env")
            .stringType()
            .noDefaultValue()
            .withDescription("PostgreSQL tables: the name of an environment variable that holds the password on "
                    + "every task manager (read when the sink opens).");

    public static final ConfigOption<String> MODE = ConfigOptions.key("sink.mode")
            .stringType()
            .defaultValue("transactional")
            .withDescription("PostgreSQL tables: 'transactional' (COPY into prepared transactions committed with "
                    + "each checkpoint; insert-only queries) or 'idempotent' (upserts on the PRIMARY KEY, visible "
                    + "at once; takes updates and deletes).");

    public static final ConfigOption<String> TRANSACTION_ID_COLUMN =
            ConfigOptions.key("sink.transaction-id-column")
                    .stringType()
                    .noDefaultValue()
                    .withDescription("PostgreSQL tables, transactional mode: a text column of the table, not "
                            + "declared in the DDL, that the sink fills with each row's transaction id. Needed "
                            + "by 'sink.rewind-policy' = 'replace-range'.");

    public static final ConfigOption<String> CONTROL_SCHEMA = ConfigOptions.key("control-schema")
            .stringType()
            .defaultValue(PostgresDestination.DEFAULT_CONTROL_SCHEMA)
            .withDescription("PostgreSQL tables: the schema of the sink's own tables (created when absent).");

    public static final ConfigOption<Boolean> CHECK_COLUMN_TYPES = ConfigOptions.key("sink.check-column-types")
            .booleanType()
            .defaultValue(true)
            .withDescription("PostgreSQL tables: stop the job at its start when a PostgreSQL column would change "
                    + "the DDL's values without an error (round a fraction, read a timestamp in the session's "
                    + "time zone). 'false' lets PostgreSQL convert them, as releases before the check did.");

    public static final ConfigOption<Duration> CONNECT_TIMEOUT = ConfigOptions.key("connect-timeout")
            .durationType()
            .defaultValue(PostgresDestination.DEFAULT_CONNECT_TIMEOUT)
            .withDescription("PostgreSQL tables: how long a connection attempt may take.");
}
