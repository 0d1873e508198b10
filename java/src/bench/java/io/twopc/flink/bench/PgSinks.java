package io.twopc.flink.bench;

import io.twopc.flink.PostgresCopyFormat;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.streaming.api.datastream.DataStream;

/**
 * twopc's PostgreSQL destination into the benchmark table: each record ({@code <id>\t<payload>})
 * is one COPY text row of {@code (id, payload)}. Transactional mode: one prepared transaction per
 * subtask and checkpoint. Idempotent mode: upserts on {@code id}, committed batch by batch.
 */
final class PgSinks {
    /** The task manager runs in this JVM: the password reaches the sink through this property. */
    static final String PASSWORD_PROPERTY = "twopc.bench.pgPassword";

    private PgSinks() {}

    static void attach(String sink, DataStream<String> stream, Sinks.Pg pg) {
        if (pg.password != null) {
            System.setProperty(PASSWORD_PROPERTY, pg.password);
        }
        PostgresDestination destination = PostgresDestination.host(pg.host, pg.port, pg.database, pg.user)
                .passwordFromSystemProperty(PASSWORD_PROPERTY)
                .table(Sinks.TABLE)
                .columns("id", "payload")
                .copyFormat(PostgresCopyFormat.TEXT);
        destination = sink.equals("twopc-pg-idem") ? destination.idempotent("id") : destination.transactional();
        stream.sinkTo(TwopcSink.<String>builder()
                        .forPostgres(destination)
                        .setSinkId(Sinks.SINK_ID)
                        .setSerializationSchema(new SimpleStringSchema())
                        .build())
                .uid("sink").name(sink);
    }
}
