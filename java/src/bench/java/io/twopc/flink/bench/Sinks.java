package io.twopc.flink.bench;

import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.serialization.SimpleStringEncoder;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.connector.file.sink.FileSink;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.functions.sink.filesystem.OutputFileConfig;
import org.apache.flink.streaming.api.functions.sink.filesystem.bucketassigners.BasePathBucketAssigner;
import org.apache.flink.streaming.api.functions.sink.filesystem.rollingpolicies.OnCheckpointRollingPolicy;

import java.io.IOException;
import java.net.URI;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

/** The sinks under test, each given the same stream of records. */
final class Sinks {
    static final String SINK_ID = "bench";
    static final String TABLE = "bench_rows";

    private Sinks() {}

    /** What a run needs to know about its sink beyond building it. */
    static final class Target {
        final boolean watchDirectory;

        Target(boolean watchDirectory) {
            this.watchDirectory = watchDirectory;
        }
    }

    static Target prepare(String sink, Path dir, String pgUrl) throws Exception {
        switch (sink) {
            case "discard":
            case "discard-serialized":
                return new Target(false);
            case "twopc-fs":
            case "twopc-fs-sinkfunction":
            case "filesink":
                return new Target(true);
            case "twopc-pg-tx":
            case "twopc-pg-idem":
            case "jdbc-xa":
            case "jdbc-xa-rewrite":
                resetTable(Pg.parse(pgUrl));
                return new Target(false);
            default:
                throw new IllegalArgumentException("unknown sink " + sink);
        }
    }

    static void attach(String sink, DataStream<String> stream, Path dir, String pgUrl, Target target) {
        // The sinks that exist on one Flink line only (SinkFunction-based ones, Flink's JDBC
        // connector) are in LineSinks: java/src/bench120 for Flink 1.20, java/src/bench2x for 2.x.
        if (LineSinks.attach(sink, stream, dir, pgUrl)) {
            return;
        }
        switch (sink) {
            case "twopc-fs":
                // The Sink V2 front end (stream.sinkTo), on both Flink lines.
                stream.sinkTo(TwopcSink.<String>builder()
                                .forDirectory(dir)
                                .setSinkId(SINK_ID)
                                .setSerializationSchema(new SimpleStringSchema())
                                .build())
                        .uid("sink").name("twopc-fs");
                break;
            case "filesink":
                // Row format, the same encoder (the string's bytes and a newline), the same flat
                // directory and the same file rolling (one file per subtask and checkpoint).
                stream.sinkTo(FileSink.forRowFormat(new org.apache.flink.core.fs.Path(dir.toUri()),
                                        new SimpleStringEncoder<String>("UTF-8"))
                                .withBucketAssigner(new BasePathBucketAssigner<>())
                                .withRollingPolicy(OnCheckpointRollingPolicy.build())
                                .withOutputFileConfig(OutputFileConfig.builder().withPartPrefix("part").build())
                                .build())
                        .uid("sink").name("filesink");
                break;
            case "twopc-pg-tx":
            case "twopc-pg-idem":
                PgSinks.attach(sink, stream, Pg.parse(pgUrl));
                break;
            default:
                throw new IllegalArgumentException("unknown sink " + sink + " on Flink " + LineSinks.LINE);
        }
    }


    /** Checks the output is complete: "ok: ..." or what is wrong. */
    static String verify(String sink, Path dir, long records, String pgUrl, Target target) throws Exception {
        switch (sink) {
            case "discard":
            case "discard-serialized":
                return "ok: nothing to check";
            case "twopc-fs":
            case "twopc-fs-sinkfunction":
            case "filesink":
                return verifyFiles(dir, records);
            default:
                return verifyTable(Pg.parse(pgUrl), records);
        }
    }

    /** Visible files (names not starting with . or _) hold exactly records x 100 bytes. */
    private static String verifyFiles(Path dir, long records) throws IOException {
        long bytes = 0;
        int files = 0;
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(dir)) {
            for (Path p : entries) {
                String name = p.getFileName().toString();
                if (name.startsWith(".") || name.startsWith("_")) {
                    continue;
                }
                bytes += Files.size(p);
                files++;
            }
        }
        long expected = records * BenchRecords.LINE_BYTES;
        return (bytes == expected ? "ok: " : "failed: ") + bytes + " bytes visible in " + files
                + " files, expected " + expected;
    }

    private static String verifyTable(Pg pg, long records) throws SQLException {
        try (Connection c = pg.connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT count(*), count(DISTINCT id) FROM " + TABLE)) {
            rs.next();
            long rows = rs.getLong(1);
            long distinct = rs.getLong(2);
            return (rows == records && distinct == records ? "ok: " : "failed: ") + rows + " rows, " + distinct
                    + " distinct ids, expected " + records;
        }
    }

    /** The same table for every PostgreSQL run, created anew so that runs start alike. */
    static void resetTable(Pg pg) throws SQLException {
        try (Connection c = pg.connect(); Statement s = c.createStatement()) {
            // Prepared transactions a failed earlier run left behind would hold locks: first.
            java.util.List<String> gids = new java.util.ArrayList<>();
            try (ResultSet rs = s.executeQuery(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")) {
                while (rs.next()) {
                    gids.add(rs.getString(1));
                }
            }
            for (String gid : gids) {
                s.execute("ROLLBACK PREPARED '" + gid.replace("'", "''") + "'");
            }
            s.execute("DROP TABLE IF EXISTS " + TABLE);
            // twopc's control tables: every run starts without another run's commit records.
            s.execute("DROP TABLE IF EXISTS twopc_commit_records, twopc_prepared, twopc_expired");
            s.execute("CREATE TABLE " + TABLE + " (id bigint PRIMARY KEY, payload text NOT NULL)");
        }
    }

    /** A libpq URL postgres://user:password@host:port/db, as scripts/postgres.sh prints it. */
    static final class Pg {
        final String host;
        final int port;
        final String database;
        final String user;
        final String password;
        final String url;

        private Pg(String url, String host, int port, String database, String user, String password) {
            this.url = url;
            this.host = host;
            this.port = port;
            this.database = database;
            this.user = user;
            this.password = password;
        }

        static Pg parse(String url) {
            if (url == null) {
                throw new IllegalArgumentException("--pg-url=postgres://user:password@host:port/db is required");
            }
            URI u = URI.create(url);
            String[] userInfo = u.getUserInfo().split(":", 2);
            return new Pg(url, u.getHost(), u.getPort(), u.getPath().substring(1), userInfo[0],
                    userInfo.length > 1 ? userInfo[1] : null);
        }

        String jdbcUrl() {
            return "jdbc:postgresql://" + host + ":" + port + "/" + database;
        }

        Connection connect() throws SQLException {
            return DriverManager.getConnection(jdbcUrl(), user, password);
        }
    }
}
