package io.twopc.flink.table;

import io.twopc.flink.TwopcException;
import io.twopc.flink.TwopcRecordRejectedException;

import org.apache.flink.annotation.Internal;
import org.apache.flink.api.common.serialization.SerializationSchema;
import org.apache.flink.table.data.RowData;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

/**
 * A directory table's format encoder, for the formats whose encoding of a row depends on the row
 * alone: a row such a format cannot serialize (a NULL map key with {@code json}'s default {@code
 * 'json.map-null-key.mode' = 'FAIL'}, a value the format has no form for) fails the same way at
 * every replay, so it is refused as a record, which stops the job once, instead of restarting it
 * forever (found by review). Formats that may fail for a moment (a schema registry that did not
 * answer) keep Flink's restart strategy: their encoders are used as they are.
 */
@Internal
final class FormatRowSchema implements SerializationSchema<RowData> {
    private static final long serialVersionUID = 1L;

    /** Flink's own formats that encode a row from the row alone. */
    static final Set<String> DETERMINISTIC = Collections.unmodifiableSet(new HashSet<>(Arrays.asList(
            "csv", "json", "raw", "debezium-json", "canal-json", "maxwell-json", "ogg-json")));

    private final SerializationSchema<RowData> encoder;
    private final String formatName;
    private final String table;

    private FormatRowSchema(SerializationSchema<RowData> encoder, String formatName, String table) {
        this.encoder = encoder;
        this.formatName = formatName;
        this.table = table;
    }

    /** {@code encoder}, refusing the rows it cannot serialize when {@code formatName} is deterministic. */
    static SerializationSchema<RowData> of(SerializationSchema<RowData> encoder, String formatName, String table) {
        return formatName != null && DETERMINISTIC.contains(formatName)
                ? new FormatRowSchema(encoder, formatName, table) : encoder;
    }

    @Override
    public void open(InitializationContext context) throws Exception {
        encoder.open(context);
    }

    @Override
    public byte[] serialize(RowData row) {
        try {
            return encoder.serialize(row);
        } catch (TwopcException e) {
            throw e;
        } catch (RuntimeException e) {
            // Flink's encoders wrap the reason in "Could not serialize row '<the whole row>'" (the
            // changelog formats twice), with "Fail to serialize at field: <name>." levels between:
            // the reason is every level's message but those quoting the row, whose values stay out
            // of the message and the chain (records are only ever shown as masked previews).
            List<String> reasons = new ArrayList<>();
            Throwable innermost = e;
            int depth = 0;
            for (Throwable t = e; t != null && depth < 16; t = t.getCause(), depth++) {
                innermost = t;
                String message = t.getMessage();
                if (message != null && !message.contains("Could not serialize row")) {
                    reasons.add(message);
                }
            }
            String reason = reasons.isEmpty() ? innermost.getClass().getName() : String.join(" ", reasons);
            TwopcRecordRejectedException rejected = new TwopcRecordRejectedException("table " + table + ": the '"
                    + formatName + "' format cannot serialize a row of kind " + row.getRowKind() + ": " + reason
                    + ". It depends on the row alone, so every replay would fail the same way. Fix or filter such "
                    + "rows in the query, or change the format's options (e.g. 'json.map-null-key.mode' for a NULL "
                    + "map key)");
            // Only a chain's real end as cause: one cut by the bound (or a cycle) would carry the
            // levels beyond it, which may quote the row.
            if (innermost != e && innermost.getCause() == null) {
                rejected.initCause(innermost);
            }
            throw rejected;
        }
    }
}
