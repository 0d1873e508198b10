package io.twopc.flink.table;

import io.twopc.flink.TwopcSink;
import io.twopc.flink.TwopcSinkBuilder;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.connector.ChangelogMode;
import org.apache.flink.table.connector.format.EncodingFormat;
import org.apache.flink.table.connector.sink.DynamicTableSink;
import org.apache.flink.table.connector.sink.SinkV2Provider;
import org.apache.flink.table.data.RowData;
import org.apache.flink.table.types.DataType;
import org.apache.flink.types.RowKind;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Consumer;

/**
 * A table of the twopc SQL connector: a {@link TwopcSink} of {@link RowData}, handed to the
 * planner through {@link SinkV2Provider} (the same on Flink 1.20 and 2.x).
 *
 * <ul>
 *   <li><b>Directory</b>: each row serialized by the table's {@code 'format'}, one record per
 *       line; the changelog the format can encode (insert-only for csv, json, raw).
 *   <li><b>PostgreSQL, transactional</b>: each row one COPY text row ({@link PostgresRowSchema});
 *       inserts only.
 *   <li><b>PostgreSQL, idempotent</b>: upserts by the primary key; accepts INSERT, UPDATE_AFTER
 *       (upserts) and DELETE (a delete by key).
 * </ul>
 *
 * <p>A query whose changelog the table cannot take is refused while it is planned, by {@link
 * #getChangelogMode(ChangelogMode)}, with what to change.
 */
@Internal
public final class TwopcDynamicTableSink implements DynamicTableSink {
    private final String table;
    /** Directory tables: the table's format; null for PostgreSQL. */
    private final EncodingFormat<SerializationSchema<RowData>> format;
    private final String formatName;
    private final DataType physicalType;
    /** PostgreSQL tables: the row writer; null for a directory. */
    private final SerializationSchema<RowData> rowSchema;
    /** Everything but the serialization schema, applied to a fresh builder. */
    private final Consumer<TwopcSinkBuilder<RowData>> settings;
    private final Integer parallelism;
    private final boolean idempotent;
    private final List<String> keys;
    private final String target;

    private TwopcDynamicTableSink(String table, EncodingFormat<SerializationSchema<RowData>> format, String formatName,
            DataType physicalType, SerializationSchema<RowData> rowSchema, Consumer<TwopcSinkBuilder<RowData>> settings,
            Integer parallelism, boolean idempotent, List<String> keys, String target) {
        this.table = table;
        this.format = format;
        this.formatName = formatName;
        this.physicalType = physicalType;
        this.rowSchema = rowSchema;
        this.settings = settings;
        this.parallelism = parallelism;
        this.idempotent = idempotent;
        this.keys = keys;
        this.target = target;
    }

    static TwopcDynamicTableSink forDirectory(String table, EncodingFormat<SerializationSchema<RowData>> format,
            DataType physicalType, Consumer<TwopcSinkBuilder<RowData>> settings, Integer parallelism,
            String formatName) {
        return new TwopcDynamicTableSink(table, format, formatName, physicalType, null, settings, parallelism, false,
                new ArrayList<>(), null);
    }

    static TwopcDynamicTableSink forPostgres(String table, Consumer<TwopcSinkBuilder<RowData>> settings,
            SerializationSchema<RowData> rowSchema, Integer parallelism, boolean idempotent, List<String> keys,
            String target) {
        return new TwopcDynamicTableSink(table, null, null, null, rowSchema, settings, parallelism, idempotent,
                new ArrayList<>(keys), target);
    }

    /** A sink with this table's settings writing records serialized by {@code schema}. */
    TwopcSink<RowData> buildSink(SerializationSchema<RowData> schema) {
        TwopcSinkBuilder<RowData> builder = TwopcSink.builder();
        settings.accept(builder);
        return builder.setSerializationSchema(schema).build();
    }

    /**
     * Upserts and deletes, each delete with the whole deleted row. Not {@code
     * ChangelogMode.upsert()}: on Flink 2.x that also says a delete may carry its key alone, and
     * the planner then hands over an upsert source's deletes without their values (no
     * ChangelogNormalize), which Flink's own NOT NULL check on the sink's input refuses at the
     * first delete into a table with a NOT NULL column besides the key ("a null value is being
     * written"). The builder's default, deletes with the whole row, is the same on 1.20 and 2.x.
     */
    private static final ChangelogMode UPSERT_WITH_WHOLE_DELETES = ChangelogMode.newBuilder()
            .addContainedKind(RowKind.INSERT)
            .addContainedKind(RowKind.UPDATE_AFTER)
            .addContainedKind(RowKind.DELETE)
            .build();

    /** The changelog the table takes. */
    ChangelogMode acceptedMode() {
        if (format != null) {
            return format.getChangelogMode();
        }
        return idempotent ? UPSERT_WITH_WHOLE_DELETES : ChangelogMode.insertOnly();
    }

    @Override
    public ChangelogMode getChangelogMode(ChangelogMode requestedMode) {
        ChangelogMode accepted = acceptedMode();
        List<RowKind> refused = new ArrayList<>();
        for (RowKind kind : requestedMode.getContainedKinds()) {
            // An upsert table takes updates as UPDATE_AFTER alone: the planner drops UPDATE_BEFORE.
            boolean upsertTakes = idempotent && kind == RowKind.UPDATE_BEFORE;
            if (!accepted.contains(kind) && !upsertTakes) {
                refused.add(kind);
            }
        }
        if (!refused.isEmpty()) {
            throw new ValidationException(refusal(requestedMode));
        }
        if (idempotent && requestedMode.containsOnly(RowKind.INSERT)) {
            // An insert-only query into an upsert table: its inserts are upserts, and the planner
            // needs no upsert key for them (Flink 2.3 would otherwise ask for ON CONFLICT).
            return ChangelogMode.insertOnly();
        }
        return accepted;
    }

    private String refusal(ChangelogMode requested) {
        String what = "twopc table '" + table + "' cannot take the query's changes: the query produces "
                + describe(requested) + ", but ";
        if (format != null) {
            return what + "this directory table writes each row with format '" + formatName + "', which encodes "
                    + describe(format.getChangelogMode()) + ". Write an insert-only query into it (no aggregation "
                    + "or join that updates its results, or a window aggregation that emits final results only), or "
                    + "choose a format that encodes changes (e.g. 'debezium-json'), or write to a PostgreSQL table "
                    + "in 'sink.mode' = 'idempotent'";
        }
        return what + "this PostgreSQL table is in 'sink.mode' = 'transactional', which appends rows (inserts only). "
                + "To keep the table up to date with the query's updates and deletes, declare the key in its DDL, "
                + "PRIMARY KEY (column, ...) NOT ENFORCED (the PostgreSQL table needs a primary key or unique index "
                + "on those columns), and set 'sink.mode' = 'idempotent'; or make the query insert-only";
    }

    private static String describe(ChangelogMode mode) {
        if (mode.containsOnly(RowKind.INSERT)) {
            return "inserts only";
        }
        List<String> kinds = new ArrayList<>();
        for (RowKind k : mode.getContainedKinds()) {
            kinds.add(k.name());
        }
        return "the changes " + String.join(", ", kinds);
    }

    @Override
    public SinkRuntimeProvider getSinkRuntimeProvider(Context context) {
        SerializationSchema<RowData> schema = format != null
                ? FormatRowSchema.of(format.createRuntimeEncoder(context, physicalType), formatName, table)
                : rowSchema;
        return SinkV2Provider.of(buildSink(schema), parallelism);
    }

    @Override
    public DynamicTableSink copy() {
        return new TwopcDynamicTableSink(table, format, formatName, physicalType, rowSchema, settings, parallelism,
                idempotent, keys, target);
    }

    /** Never an option's value: the kind of table and where it writes, no connection string. */
    @Override
    public String asSummaryString() {
        if (format != null) {
            return "twopc (directory, format " + formatName + ")";
        }
        return "twopc (PostgreSQL table " + target + ", " + (idempotent ? "idempotent on " + keys : "transactional")
                + ")";
    }
}
