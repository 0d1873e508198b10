package io.twopc.flink.table;

import io.twopc.flink.FreshStartPolicy;
import io.twopc.flink.CommitOrder;
import io.twopc.flink.IoMode;
import io.twopc.flink.ObjectStoreDestination;
import io.twopc.flink.PostgresCopyFormat;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.RecordFormat;
import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcSinkBuilder;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.configuration.ConfigOption;
import org.apache.flink.configuration.ReadableConfig;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.connector.format.EncodingFormat;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.factories.DynamicTableSinkFactory;
import org.apache.flink.table.factories.Factory;
import org.apache.flink.table.factories.FactoryUtil;
import org.apache.flink.table.factories.SerializationFormatFactory;
import org.apache.flink.table.types.DataType;
import org.apache.flink.table.types.logical.RowType;

import java.io.UnsupportedEncodingException;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.ServiceLoader;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.Consumer;
import java.util.stream.Collectors;

import static io.twopc.flink.table.TwopcConnectorOptions.*;

/**
 * The SQL connector {@code 'connector' = 'twopc'}: creates a {@link TwopcDynamicTableSink} for a
 * directory ({@code 'path'}, {@code 'format'}) or a PostgreSQL table ({@code 'url'}, {@code
 * 'table-name'}). Everything is validated here, at planning: unknown options and values that do
 * not parse ({@code helper.validate()}), options of the other kind of table, conflicting options,
 * the columns' types (PostgreSQL), the mode against the primary key, and finally the whole
 * configuration through the same checks as {@code TwopcSinkBuilder.build()} (the native core's).
 * Each error is a {@link ValidationException} that names the table and the option.
 */
@Internal
public final class TwopcDynamicTableSinkFactory implements DynamicTableSinkFactory {

    /** Options only a directory table takes. */
    static final List<ConfigOption<?>> DIRECTORY_OPTIONS =
            Arrays.asList(PATH, FORMAT, PART_PREFIX, PART_SUFFIX, RECORD_FORMAT, IO_MODE, COMMIT_ORDER, S3_ENDPOINT,
                    S3_REGION, S3_PATH_STYLE_ACCESS, S3_ALLOW_HTTP, S3_PROFILE, S3_PART_SIZE, SAVEPOINT_RETENTION);

    /** Options of a 'path' table that only an object store ('s3://...') takes. */
    static final List<ConfigOption<?>> OBJECT_STORE_OPTIONS = Arrays.asList(S3_ENDPOINT, S3_REGION,
            S3_PATH_STYLE_ACCESS, S3_ALLOW_HTTP, S3_PROFILE, S3_PART_SIZE, SAVEPOINT_RETENTION);

    /** Options only a PostgreSQL table takes. */
    static final List<ConfigOption<?>> POSTGRES_OPTIONS = Arrays.asList(URL, TABLE_NAME, USERNAME, PASSWORD,
            PASSWORD_ENV, MODE, TRANSACTION_ID_COLUMN, CONTROL_SCHEMA, CONNECT_TIMEOUT, CHECK_COLUMN_TYPES);

    @Override
    public String factoryIdentifier() {
        return IDENTIFIER;
    }

    @Override
    public Set<ConfigOption<?>> requiredOptions() {
        return Collections.singleton(SINK_ID);
    }

    @Override
    public Set<ConfigOption<?>> optionalOptions() {
        Set<ConfigOption<?>> options = new LinkedHashSet<>();
        options.addAll(Arrays.asList(SINK_PARALLELISM, REWIND_POLICY, FRESH_START_POLICY, RETENTION,
                RESTART_ALLOWANCE, CHECKPOINT_INTERVAL, BATCH_SIZE, BATCH_BYTES, COMMIT_MAX_ATTEMPTS,
                COMMIT_INITIAL_BACKOFF, COMMIT_MAX_BACKOFF, OWNER_WAIT, LINEAGE_WAIT, TIMEOUT_WARNING_RATIO));
        options.addAll(DIRECTORY_OPTIONS);
        options.addAll(POSTGRES_OPTIONS);
        return options;
    }

    @Override
    public TwopcDynamicTableSink createDynamicTableSink(Context context) {
        FactoryUtil.TableFactoryHelper helper = FactoryUtil.createTableFactoryHelper(this, context);
        String table = context.getObjectIdentifier().asSummaryString();
        Map<String, String> given = context.getCatalogTable().getOptions();
        boolean directory = given.containsKey(PATH.key());
        boolean postgres = given.containsKey(URL.key());
        if (directory == postgres) {
            throw new ValidationException(prefix(table) + (directory
                    ? "both 'path' (a directory) and 'url' (a PostgreSQL table) are set; a table writes to one: "
                            + "keep 'path' with 'format', or 'url' with 'table-name'"
                    : "neither 'path' (a directory) nor 'url' (a PostgreSQL table) is set; give 'path' and 'format', "
                            + "or 'url' and 'table-name'") + ". " + knownOptions());
        }
        refuseOptionsOfTheOtherKind(table, given, directory);
        refuseObjectStoreOptionsForADirectory(table, given);

        EncodingFormat<SerializationSchema<RowData>> format = null;
        if (directory) {
            format = discoverFormat(helper, context, table, given.get(FORMAT.key()));
        }
        // Unknown options (the format's own, prefixed ones included) and values that do not parse.
        helper.validate();
        ReadableConfig options = helper.getOptions();

        DataType physicalType = context.getPhysicalRowDataType();
        RowType rowType = (RowType) physicalType.getLogicalType();
        List<String> columns = rowType.getFieldNames();
        int[] keyIndexes = context.getPrimaryKeyIndexes();
        List<String> keys = new ArrayList<>();
        for (int i : keyIndexes) {
            keys.add(columns.get(i));
        }

        Consumer<TwopcSinkBuilder<RowData>> common = commonSettings(table, options);
        Integer parallelism = options.getOptional(SINK_PARALLELISM).orElse(null);
        if (directory) {
            Consumer<TwopcSinkBuilder<RowData>> settings = common.andThen(directorySettings(table, options));
            TwopcDynamicTableSink sink = TwopcDynamicTableSink.forDirectory(table, format, physicalType, settings,
                    parallelism, given.get(FORMAT.key()));
            // Everything the builder checks, now (with a stand-in for the format's encoder, which
            // only the planner's sink context can create).
            check(table, () -> sink.buildSink(record -> new byte[0]));
            return sink;
        }

        boolean idempotent = parseChoice(table, MODE, options.get(MODE), "transactional", "idempotent")
                .equals("idempotent");
        String txnColumn = options.getOptional(TRANSACTION_ID_COLUMN).orElse(null);
        RewindPolicy rewind = rewindPolicy(table, options);
        if (idempotent) {
            if (keys.isEmpty()) {
                throw new ValidationException(prefix(table) + "'sink.mode' = 'idempotent' upserts and deletes by the "
                        + "table's primary key, and the table declares none. Declare it in the DDL: PRIMARY KEY "
                        + "(column, ...) NOT ENFORCED (the PostgreSQL table needs a primary key or unique index on "
                        + "exactly those columns), or use 'sink.mode' = 'transactional' for insert-only queries");
            }
            if (txnColumn != null) {
                throw new ValidationException(prefix(table) + "'sink.transaction-id-column' applies to 'sink.mode' = "
                        + "'transactional' only (in idempotent mode a replay overwrites rows by key); remove it");
            }
            if (rewind == RewindPolicy.REPLACE_RANGE) {
                throw new ValidationException(prefix(table) + "'sink.rewind-policy' = 'replace-range' applies to "
                        + "'sink.mode' = 'transactional' only (in idempotent mode a replay rewrites the same keys, so "
                        + "there is no rewind to repair); remove it");
            }
        } else if (rewind == RewindPolicy.REPLACE_RANGE && txnColumn == null) {
            throw new ValidationException(prefix(table) + "'sink.rewind-policy' = 'replace-range' removes the rows of "
                    + "the transactions it rewinds, which needs 'sink.transaction-id-column': a text column of the "
                    + "PostgreSQL table, not declared in the DDL, that the sink fills with each row's transaction id");
        }
        PostgresRowSchema.checkTypes(table, rowType);
        PostgresDestination unchecked = postgresDestination(table, options, columns, keys, idempotent, txnColumn);
        // Without declared types the native side has nothing to judge: PostgreSQL converts the
        // values, as before the check existed (the way out for a job whose columns it refuses).
        PostgresDestination destination = options.get(CHECK_COLUMN_TYPES)
                ? unchecked.withDeclaredColumnTypes(PostgresRowSchema.declaredTypes(rowType))
                : unchecked;
        PostgresRowSchema schema = new PostgresRowSchema(rowType, idempotent);
        TwopcDynamicTableSink sink = TwopcDynamicTableSink.forPostgres(table,
                common.andThen(b -> b.forPostgres(destination)), schema, parallelism, idempotent, keys,
                options.get(TABLE_NAME));
        check(table, () -> sink.buildSink(schema));
        return sink;
    }

    // ------------------------------------------------------------------ option groups

    private static Consumer<TwopcSinkBuilder<RowData>> commonSettings(String table, ReadableConfig options) {
        String sinkId = options.get(SINK_ID);
        RewindPolicy rewind = rewindPolicy(table, options);
        FreshStartPolicy freshStart = FreshStartPolicy.valueOf(parseChoice(table, FRESH_START_POLICY,
                options.get(FRESH_START_POLICY), "fail", "abort-prepared", "append", "append-and-abort-prepared")
                .toUpperCase(Locale.ROOT).replace('-', '_'));
        long batchBytes = options.get(BATCH_BYTES).getBytes();
        if (batchBytes > Integer.MAX_VALUE) {
            throw new ValidationException(prefix(table) + "'sink.batch-bytes' = '" + options.get(BATCH_BYTES)
                    + "' is too large: every subtask holds a buffer of this size; give at most 256 mb (the default "
                    + "is 1 mb)");
        }
        return b -> {
            b.setSinkId(sinkId)
                    .setRewindPolicy(rewind)
                    .setFreshStartPolicy(freshStart)
                    .setRetention(options.get(RETENTION))
                    .setRestartAllowance(options.get(RESTART_ALLOWANCE))
                    .setBatchSize(options.get(BATCH_SIZE))
                    .setBatchBytes((int) batchBytes)
                    .setCommitMaxAttempts(options.get(COMMIT_MAX_ATTEMPTS))
                    .setCommitRetryBackoff(options.get(COMMIT_INITIAL_BACKOFF), options.get(COMMIT_MAX_BACKOFF))
                    .setOwnerWait(options.get(OWNER_WAIT))
                    .setLineageWait(options.get(LINEAGE_WAIT))
                    .setTimeoutWarningRatio(options.get(TIMEOUT_WARNING_RATIO));
            options.getOptional(CHECKPOINT_INTERVAL).ifPresent(b::setCheckpointInterval);
        };
    }

    private static RewindPolicy rewindPolicy(String table, ReadableConfig options) {
        return RewindPolicy.valueOf(parseChoice(table, REWIND_POLICY, options.get(REWIND_POLICY), "fail",
                "replace-range").toUpperCase(Locale.ROOT).replace('-', '_'));
    }

    private static Consumer<TwopcSinkBuilder<RowData>> directorySettings(String table, ReadableConfig options) {
        String path = options.get(PATH);
        String prefix = options.get(PART_PREFIX);
        String suffix = options.get(PART_SUFFIX);
        RecordFormat recordFormat = RecordFormat.valueOf(parseChoice(table, RECORD_FORMAT,
                options.get(RECORD_FORMAT), "lines", "raw").toUpperCase(Locale.ROOT));
        IoMode ioMode = IoMode.valueOf(parseChoice(table, IO_MODE, options.get(IO_MODE), "auto", "direct",
                "buffered").toUpperCase(Locale.ROOT));
        CommitOrder commitOrder = CommitOrder.valueOf(parseChoice(table, COMMIT_ORDER, options.get(COMMIT_ORDER),
                "durable-first", "visible-first").toUpperCase(Locale.ROOT).replace('-', '_'));
        if (ObjectStoreDestination.isObjectStoreUrl(path)) {
            ObjectStoreDestination store = ObjectStoreDestination.s3(path)
                    .endpoint(options.getOptional(S3_ENDPOINT).orElse(null))
                    .region(options.getOptional(S3_REGION).orElse(null))
                    .pathStyleAccess(options.get(S3_PATH_STYLE_ACCESS))
                    .allowHttp(options.get(S3_ALLOW_HTTP))
                    .profile(options.getOptional(S3_PROFILE).orElse(null))
                    .partSize(options.get(S3_PART_SIZE).getBytes())
                    .savepointRetention(options.get(SAVEPOINT_RETENTION));
            return b -> b.forObjectStore(store)
                    .setPartPrefix(prefix)
                    .setPartSuffix(suffix)
                    .setRecordFormat(recordFormat)
                    .setIoMode(ioMode)
                    .setCommitOrder(commitOrder);
        }
        return b -> b.forDirectory(path)
                .setPartPrefix(prefix)
                .setPartSuffix(suffix)
                .setRecordFormat(recordFormat)
                .setIoMode(ioMode)
                .setCommitOrder(commitOrder);
    }

    /** The object-store options set on a table whose 'path' is a directory: a mistake, refused. */
    private static void refuseObjectStoreOptionsForADirectory(String table, Map<String, String> given) {
        String path = given.get(PATH.key());
        if (path == null || ObjectStoreDestination.isObjectStoreUrl(path)) {
            return;
        }
        List<String> set = new ArrayList<>();
        for (ConfigOption<?> o : OBJECT_STORE_OPTIONS) {
            if (given.containsKey(o.key())) {
                set.add("'" + o.key() + "'");
            }
        }
        if (!set.isEmpty()) {
            throw new ValidationException(prefix(table) + String.join(", ", set) + (set.size() > 1 ? " apply" : " applies")
                    + " to an object store ('path' = 's3://bucket/prefix') only, and 'path' is the directory '" + path
                    + "'; remove " + (set.size() > 1 ? "them" : "it") + ", or give an s3:// path");
        }
    }

    private static PostgresDestination postgresDestination(String table, ReadableConfig options,
            List<String> columns, List<String> keys, boolean idempotent, String txnColumn) {
        String url = connectionString(table, options.get(URL), options.getOptional(USERNAME).orElse(null));
        PostgresDestination d = PostgresDestination.url(url)
                .table(options.get(TABLE_NAME))
                .columns(columns.toArray(new String[0]))
                .copyFormat(PostgresCopyFormat.TEXT)
                .controlSchema(options.get(CONTROL_SCHEMA))
                .connectTimeout(options.get(CONNECT_TIMEOUT));
        String password = options.getOptional(PASSWORD).orElse(null);
        String passwordEnv = options.getOptional(PASSWORD_ENV).orElse(null);
        if (password != null && passwordEnv != null) {
            throw new ValidationException(prefix(table) + "both 'password' and 'password-env' are set; give the "
                    + "password one way: 'password-env' (the name of an environment variable every task manager "
                    + "has) or 'password'");
        }
        if (password != null) {
            d = d.passwordFromTableOption(password);
        } else if (passwordEnv != null) {
            d = d.passwordFromEnvironment(passwordEnv);
        }
        if (idempotent) {
            d = d.idempotent(keys.toArray(new String[0])).withOperationField();
        } else if (txnColumn != null) {
            d = d.transactionIdColumn(txnColumn);
        }
        return d;
    }

    /**
     * The connection string the sink opens: {@code jdbc:postgresql://} read as {@code
     * postgresql://}, with {@code 'username'} added as the URL's user (or the key=value form's).
     * Whether the result is acceptable (a password in it, say) is the builder's check.
     */
    static String connectionString(String table, String url, String username) {
        String u = url.trim();
        if (u.startsWith("jdbc:postgresql://")) {
            u = u.substring("jdbc:".length());
        }
        if (username == null) {
            return u;
        }
        if (username.isEmpty()) {
            throw new ValidationException(prefix(table) + "'username' is empty; give the user, or leave the option "
                    + "out and name the user in 'url' (postgres://user@host:5432/database)");
        }
        int scheme = u.indexOf("://");
        if (scheme < 0) {
            if (PostgresDestination.keyValueNamesUser(u)) {
                throw userTwice(table);
            }
            return u + " user='" + username.replace("\\", "\\\\").replace("'", "\\'") + "'";
        }
        String rest = u.substring(scheme + 3);
        int authorityEnd = rest.length();
        for (char c : new char[] {'/', '?', '#'}) {
            int i = rest.indexOf(c);
            if (i >= 0 && i < authorityEnd) {
                authorityEnd = i;
            }
        }
        if (rest.substring(0, authorityEnd).indexOf('@') >= 0 || rest.contains("user=")) {
            throw userTwice(table);
        }
        try {
            return u.substring(0, scheme + 3) + URLEncoder.encode(username, StandardCharsets.UTF_8.name())
                    .replace("+", "%20") + "@" + rest;
        } catch (UnsupportedEncodingException e) {
            throw new IllegalStateException(e);
        }
    }

    private static ValidationException userTwice(String table) {
        return new ValidationException(prefix(table) + "'url' names a user and 'username' is set too; give the "
                + "user once: remove 'username', or the user from 'url'");
    }

    // ------------------------------------------------------------------ checks

    private static void refuseOptionsOfTheOtherKind(String table, Map<String, String> given, boolean directory) {
        List<ConfigOption<?>> foreign = directory ? POSTGRES_OPTIONS : DIRECTORY_OPTIONS;
        List<String> found = new ArrayList<>();
        for (ConfigOption<?> option : foreign) {
            if (given.containsKey(option.key())) {
                found.add("'" + option.key() + "'");
            }
        }
        if (!found.isEmpty()) {
            throw new ValidationException(prefix(table) + String.join(", ", found) + (found.size() == 1 ? " applies"
                    : " apply") + " to " + (directory ? "PostgreSQL tables ('url')" : "directory tables ('path')")
                    + " only, but this table writes to " + (directory ? "a directory ('path')" : "PostgreSQL ('url')")
                    + "; remove " + (found.size() == 1 ? "it" : "them") + ". " + knownOptions());
        }
    }

    /** Flink's formats whose records are binary, without framing of their own. */
    static final Set<String> BINARY_FORMATS = Collections.unmodifiableSet(new HashSet<>(Arrays.asList(
            "avro", "avro-confluent", "debezium-avro-confluent", "protobuf")));

    /** The format factory named by {@code 'format'}: one that writes one serialized record per row. */
    private static EncodingFormat<SerializationSchema<RowData>> discoverFormat(FactoryUtil.TableFactoryHelper helper,
            Context context, String table, String identifier) {
        Set<String> known = serializationFormats(context.getClassLoader());
        if (identifier != null && BINARY_FORMATS.contains(identifier.trim())) {
            // Found by review: such a table planned, then stopped on the first row whose bytes held
            // a line feed (common in binary encodings), or wrote rows back to back that no reader
            // can split ('sink.record-format' = 'raw').
            throw new ValidationException(prefix(table) + "'format' = '" + identifier.trim() + "' writes binary "
                    + "records, which may hold any byte, line feeds included, and carry no length: written "
                    + "one per line they would be cut apart, and back to back they could not be split again. "
                    + "Directory tables write text records: use a text format such as 'json' or 'csv'");
        }
        if (identifier == null || identifier.trim().isEmpty()) {
            throw new ValidationException(prefix(table) + "a directory table needs 'format', the format each row is "
                    + "written in, one record per line; formats on the classpath: " + String.join(", ", known));
        }
        if (!known.contains(identifier)) {
            throw new ValidationException(prefix(table) + "'format' = '" + identifier + "' is not a format on the "
                    + "classpath that serializes one record per row (a SerializationFormatFactory; bulk formats such "
                    + "as parquet or orc are not); formats on the classpath: " + String.join(", ", known)
                    + " (add the format's jar to use another)");
        }
        return helper.discoverEncodingFormat(SerializationFormatFactory.class, FORMAT);
    }

    /** Identifiers of the {@link SerializationFormatFactory} implementations {@code loader} sees. */
    static Set<String> serializationFormats(ClassLoader loader) {
        Set<String> names = new TreeSet<>();
        for (Factory f : ServiceLoader.load(Factory.class, loader)) {
            if (f instanceof SerializationFormatFactory) {
                names.add(f.factoryIdentifier());
            }
        }
        return names;
    }

    /**
     * {@code value}, lower case with dashes, if it is one of {@code choices} (the Java spelling,
     * {@code REPLACE_RANGE}, is accepted too).
     */
    static String parseChoice(String table, ConfigOption<String> option, String value, String... choices) {
        String v = value.trim().toLowerCase(Locale.ROOT).replace('_', '-');
        for (String c : choices) {
            if (c.equals(v)) {
                return c;
            }
        }
        throw new ValidationException(prefix(table) + "'" + option.key() + "' = '" + value + "' is not one of "
                + Arrays.stream(choices).map(c -> "'" + c + "'").collect(Collectors.joining(", ")));
    }

    /** Runs {@code build}, turning the builder's refusal into a ValidationException with the option names. */
    private static void check(String table, Runnable build) {
        try {
            build.run();
        } catch (TwopcConfigException e) {
            throw new ValidationException(prefix(table) + "the options cannot work: " + optionNames(e.getMessage()));
        }
    }

    /** The builder's words for its settings, as the table options a SQL user sets. */
    static String optionNames(String message) {
        String m = message.replaceFirst("^cannot build TwopcSink( '[^']*')?: ", "");
        String[][] names = {
            {"setSinkId(\"my-sink\")", "'sink-id'"},
            {"setRetention(...)", "'sink.retention'"},
            {"setRestartAllowance(...)", "'sink.restart-allowance'"},
            {"setCheckpointInterval(...)", "'sink.checkpoint-interval'"},
            {"setBatchSize(" + TwopcSinkBuilder.DEFAULT_BATCH_SIZE + ")", "'sink.batch-size' = '"
                    + TwopcSinkBuilder.DEFAULT_BATCH_SIZE + "'"},
            {"setBatchBytes(" + TwopcSinkBuilder.DEFAULT_BATCH_BYTES + ")", "'sink.batch-bytes' = '1 mb'"},
            {"setPartPrefix(...)", "'sink.part-prefix'"},
            {"setPartSuffix(...)", "'sink.part-suffix'"},
            {"forDirectory(\"/absolute/path\")", "'path'"},
            {"passwordFromEnvironment(\"VARIABLE\") or passwordFromSystemProperty(\"property\")",
                "'password-env' (the name of an environment variable) or 'password'"},
            {"passwordFromEnvironment(...)", "'password-env'"},
            {"transactionIdColumn", "'sink.transaction-id-column'"},
            {"setIoMode(...)", "'sink.io-mode'"},
            {"setCommitOrder(...)", "'sink.commit-order'"},
            {"partSize(" + ObjectStoreDestination.DEFAULT_PART_SIZE + ")", "'s3.part-size' = '8mb'"},
            {"allowHttp(true)", "'s3.allow-http' = 'true'"},
            {"PostgreSQL URL", "'url'"},
            {"PostgreSQL table", "'table-name'"},
            {"control schema", "'control-schema'"},
            {"PostgreSQL connect timeout", "'connect-timeout'"},
            {"output directory", "'path'"},
            {"sink id", "'sink-id'"},
            {"staged-transaction retention", "'sink.retention'"},
            {"commit max attempts", "'sink.commit.max-attempts'"},
            {"timeout warning ratio", "'sink.timeout-warning-ratio'"},
            {"part prefix", "'sink.part-prefix'"},
            {"part suffix", "'sink.part-suffix'"},
            {"batch size", "'sink.batch-size'"},
            {"batch bytes", "'sink.batch-bytes'"},
        };
        for (String[] n : names) {
            m = m.replace(n[0], n[1]);
        }
        return m;
    }

    static String prefix(String table) {
        return "twopc table '" + table + "': ";
    }

    private static String knownOptions() {
        List<String> keys = new ArrayList<>();
        keys.add(SINK_ID.key());
        for (ConfigOption<?> o : new TwopcDynamicTableSinkFactory().optionalOptions()) {
            keys.add(o.key());
        }
        return "Directory tables take 'path', 'format' (with its own options, e.g. 'csv.field-delimiter'), "
                + DIRECTORY_OPTIONS.stream().skip(2).map(o -> "'" + o.key() + "'").collect(Collectors.joining(", "))
                + "; PostgreSQL tables take "
                + POSTGRES_OPTIONS.stream().map(o -> "'" + o.key() + "'").collect(Collectors.joining(", "))
                + "; all tables take 'sink-id' (required) and "
                + keys.stream().filter(k -> !k.equals(SINK_ID.key())
                        && DIRECTORY_OPTIONS.stream().noneMatch(o -> o.key().equals(k))
                        && POSTGRES_OPTIONS.stream().noneMatch(o -> o.key().equals(k)))
                        .map(k -> "'" + k + "'").collect(Collectors.joining(", "));
    }

}
