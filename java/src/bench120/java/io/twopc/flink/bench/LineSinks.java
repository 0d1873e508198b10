package io.twopc.flink.bench;

import io.twopc.flink.TwopcSinkFunction;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.connector.jdbc.JdbcExactlyOnceOptions;
import org.apache.flink.connector.jdbc.JdbcExecutionOptions;
import org.apache.flink.connector.jdbc.JdbcSink;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.functions.sink.DiscardingSink;

import org.postgresql.xa.PGXADataSource;

import java.nio.file.Path;

/**
 * The sinks of the benchmark that exist on Flink 1.20 only: the SinkFunction-based ones (Flink's
 * {@code DiscardingSink}, the serialization ceiling, twopc's SinkFunction shim) and Flink's JDBC
 * connector (whose exactly-once sink is a SinkFunction). The Flink 2.x build has its own
 * LineSinks (java/src/bench2x).
 */
final class LineSinks {
    static final String LINE = "1.20";

    private LineSinks() {}

    /** Attaches {@code sink} if it is one of these; false otherwise. */
    static boolean attach(String sink, DataStream<String> stream, Path dir, String pgUrl) {
        switch (sink) {
            case "discard":
                stream.addSink(new DiscardingSink<>()).uid("sink").name("discard");
                return true;
            case "discard-serialized":
                stream.addSink(new SerializingDiscardingSink(new SimpleStringSchema()))
                        .uid("sink").name("discard-serialized");
                return true;
            case "twopc-fs-sinkfunction":
                // The SinkFunction shim (stream.addSink), Flink 1.20 only.
                stream.addSink(TwopcSinkFunction.<String>builder()
                                .forDirectory(dir)
                                .setSinkId(Sinks.SINK_ID)
                                .setSerializationSchema(new SimpleStringSchema())
                                .build())
                        .uid("sink").name("twopc-fs-sinkfunction");
                return true;
            case "jdbc-xa":
                attachJdbcXa(stream, Sinks.Pg.parse(pgUrl), false);
                return true;
            case "jdbc-xa-rewrite":
                attachJdbcXa(stream, Sinks.Pg.parse(pgUrl), true);
                return true;
            default:
                return false;
        }
    }

    /**
     * Flink's JDBC connector, exactly-once: XA transactions, one per subtask and checkpoint,
     * prepared at the checkpoint and committed when it completes, configured as Flink's
     * documentation shows it for PostgreSQL: a connection per transaction, retries off (XA needs
     * that), batches of 5000 rows. With {@code rewriteBatchedInserts} the driver also turns each
     * batch into multi-row INSERTs, its fastest insert mode (not the default).
     */
    private static void attachJdbcXa(DataStream<String> stream, Sinks.Pg pg, boolean rewriteBatchedInserts) {
        String url = pg.jdbcUrl();
        String user = pg.user;
        String password = pg.password;
        stream.addSink(JdbcSink.exactlyOnceSink(
                        "INSERT INTO " + Sinks.TABLE + " (id, payload) VALUES (?, ?)",
                        (statement, record) -> {
                            statement.setLong(1, Long.parseLong(record, 0, BenchRecords.ID_DIGITS, 10));
                            statement.setString(2, record.substring(BenchRecords.ID_DIGITS + 1));
                        },
                        JdbcExecutionOptions.builder().withMaxRetries(0).withBatchSize(5000).build(),
                        JdbcExactlyOnceOptions.builder().withTransactionPerConnection(true).build(),
                        () -> {
                            PGXADataSource ds = new PGXADataSource();
                            ds.setUrl(url);
                            ds.setUser(user);
                            ds.setPassword(password);
                            ds.setReWriteBatchedInserts(rewriteBatchedInserts);
                            return ds;
                        }))
                .uid("sink").name(rewriteBatchedInserts ? "jdbc-xa-rewrite" : "jdbc-xa");
    }
}
