package io.twopc.flink.bench;

import io.twopc.flink.CommitOrder;
import io.twopc.flink.ObjectStoreDestination;
import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.serialization.SimpleStringEncoder;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.CoreOptions;
import org.apache.flink.connector.file.sink.FileSink;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.plugin.DefaultPluginManager;
import org.apache.flink.core.plugin.DirectoryBasedPluginFinder;
import org.apache.flink.core.plugin.PluginDescriptor;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.functions.sink.filesystem.OutputFileConfig;
import org.apache.flink.streaming.api.functions.sink.filesystem.bucketassigners.BasePathBucketAssigner;
import org.apache.flink.streaming.api.functions.sink.filesystem.rollingpolicies.OnCheckpointRollingPolicy;

import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.BitSet;
import java.util.Collection;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;

/** The sinks under test, each given the same stream of records. */
final class Sinks {
    static final String SINK_ID = "bench";
    static final String TABLE = "bench_rows";

    private Sinks() {}

    /**
     * Bytes per multipart part for both object-store sinks: twopc's default, given to FileSink's
     * S3 writer too ({@code s3.upload.min.part.size}, default 5 MiB), so that neither sink makes
     * fewer, larger requests by configuration alone. (Each still ends a checkpoint's object with a
     * shorter part.)
     */
    static final long PART_SIZE = ObjectStoreDestination.DEFAULT_PART_SIZE;

    /** What a run needs to know about its sink beyond building it. */
    static final class Target {
        final boolean watchDirectory;
        /** The bucket of an object-store case, else null. */
        final Store store;

        Target(boolean watchDirectory) {
            this(watchDirectory, null);
        }

        Target(boolean watchDirectory, Store store) {
            this.watchDirectory = watchDirectory;
            this.store = store;
        }
    }

    /** An object-store case's output: {@code s3://bucket/prefix} on the local server. */
    static final class Store {
        final BenchS3 s3;
        final String bucket;
        final String prefix;

        Store(BenchS3 s3, String bucket, String prefix) {
            this.s3 = s3;
            this.bucket = bucket;
            this.prefix = prefix;
        }

        String url() {
            return "s3://" + bucket + "/" + prefix;
        }
    }

    /** The object-store cases' settings (command-line arguments of BenchJob). */
    static final class S3Settings {
        final String endpoint;
        final Path pluginsDir;

        S3Settings(String endpoint, Path pluginsDir) {
            this.endpoint = endpoint;
            this.pluginsDir = pluginsDir;
        }
    }

    static Target prepare(String sink, Path dir, String pgUrl, S3Settings s3) throws Exception {
        switch (sink) {
            case "discard":
            case "discard-serialized":
                return new Target(false);
            case "twopc-fs":
            case "twopc-fs-vf":
            case "twopc-fs-sinkfunction":
            case "filesink":
                return new Target(true);
            case "twopc-pg-tx":
            case "twopc-pg-idem":
            case "jdbc-xa":
            case "jdbc-xa-rewrite":
                resetTable(Pg.parse(pgUrl));
                return new Target(false);
            case "twopc-s3":
                return new Target(false, newStore(s3, dir));
            case "filesink-s3":
                initializeS3FileSystem(s3, dir);
                return new Target(false, newStore(s3, dir));
            default:
                throw new IllegalArgumentException("unknown sink " + sink);
        }
    }

    /**
     * A bucket of the run's own, {@code twopc-bench-<run>-<random>}, and the run's name as the
     * prefix ({@code <case>-<round>}, the name of its scratch directory).
     */
    private static Store newStore(S3Settings settings, Path dir) throws IOException {
        BenchS3 s3 = new BenchS3(settings == null ? null : settings.endpoint);
        String run = dir.getFileName().toString().toLowerCase(Locale.ROOT).replaceAll("[^a-z0-9-]+", "-");
        String suffix = UUID.randomUUID().toString().substring(0, 8);
        String bucket = ("twopc-bench-" + run).replaceAll("-+$", "");
        bucket = bucket.substring(0, Math.min(bucket.length(), 63 - 9)) + "-" + suffix;
        s3.createBucket(bucket);
        return new Store(s3, bucket, run);
    }

    /**
     * Flink's S3 filesystem (flink-s3-fs-hadoop) for FileSink, loaded as Flink loads it on a
     * cluster: as a plugin, from {@code <plugins dir>/s3-fs-hadoop/*.jar}, in a class loader of
     * its own. It has to be: the jar bundles Hadoop, the AWS SDK, Guava, Jackson and Apache
     * Commons without relocating them, so on the job's classpath it would replace the versions
     * Flink runs with. The in-process cluster starts no plugin manager itself, so this is the
     * initialisation a task manager does at start. The {@code s3.*} keys are the plugin's ({@code
     * fs.s3a.*} of Hadoop's S3A underneath): the local server, path-style requests, plain HTTP, the
     * same keys twopc takes from the environment.
     */
    private static void initializeS3FileSystem(S3Settings settings, Path dir) throws IOException {
        // Fails with what to do when the server's endpoint is missing.
        String endpoint = new BenchS3(settings == null ? null : settings.endpoint).endpoint;
        Path pluginsDir = settings.pluginsDir;
        Path pluginDir = pluginsDir == null ? null : pluginsDir.resolve("s3-fs-hadoop");
        boolean hasJar = false;
        if (pluginDir != null && Files.isDirectory(pluginDir)) {
            try (DirectoryStream<Path> jars = Files.newDirectoryStream(pluginDir, "*.jar")) {
                hasJar = jars.iterator().hasNext();
            }
        }
        if (!hasJar) {
            throw new IllegalStateException("no flink-s3-fs-hadoop jar in " + pluginDir + ": build it with "
                    + "gradle --no-daemon -q benchClasspath (it lays out build/bench/plugins) and pass "
                    + "--s3-plugins-dir=build/bench/plugins");
        }
        String accessKey = System.getenv("AWS_ACCESS_KEY_ID");
        String secretKey = System.getenv("AWS_SECRET_ACCESS_KEY");
        if (accessKey == null || secretKey == null) {
            throw new IllegalStateException("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set (any values: "
                    + "the local server accepts all); bench/run.py sets them for the object-store cases");
        }
        Path tmp = dir.resolve("s3-fs-tmp");
        Files.createDirectories(tmp);
        Map<String, String> fs = new HashMap<>();
        fs.put("s3.endpoint", endpoint);
        fs.put("s3.endpoint.region", "us-east-1");
        fs.put("s3.path.style.access", "true");
        fs.put("s3.connection.ssl.enabled", String.valueOf(endpoint.startsWith("https:")));
        fs.put("s3.access-key", accessKey);
        fs.put("s3.secret-key", secretKey);
        fs.put("s3.upload.min.part.size", String.valueOf(PART_SIZE));
        // Where the S3 writer buffers a part before uploading it: the run's scratch directory
        // (removed after the run), not /tmp.
        fs.put(CoreOptions.TMP_DIRS.key(), tmp.toString());
        Configuration conf = Configuration.fromMap(fs);
        Collection<PluginDescriptor> plugins = new DirectoryBasedPluginFinder(pluginsDir).findPlugins();
        FileSystem.initialize(conf,
                new DefaultPluginManager(plugins, CoreOptions.getPluginParentFirstLoaderPatterns(conf)));
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
            case "twopc-fs-vf":
                // The same, with commits that show their output before they are durable.
                stream.sinkTo(TwopcSink.<String>builder()
                                .forDirectory(dir)
                                .setSinkId(SINK_ID)
                                .setSerializationSchema(new SimpleStringSchema())
                                .setCommitOrder(CommitOrder.VISIBLE_FIRST)
                                .build())
                        .uid("sink").name("twopc-fs-vf");
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
            case "twopc-s3":
                // The same job into the bucket: each transaction one multipart upload, completed
                // when its checkpoint completes.
                stream.sinkTo(TwopcSink.<String>forObjectStore(ObjectStoreDestination.s3(target.store.url())
                                        .endpoint(target.store.s3.endpoint)
                                        .pathStyleAccess(true)
                                        .allowHttp(true)
                                        .partSize(PART_SIZE))
                                .setSinkId(SINK_ID)
                                .setSerializationSchema(new SimpleStringSchema())
                                .build())
                        .uid("sink").name("twopc-s3");
                break;
            case "filesink-s3":
                // The filesink case's sink, on s3:// through the plugin: its S3 writer stages each
                // part file as a multipart upload too, completed when the checkpoint completes.
                stream.sinkTo(FileSink.forRowFormat(new org.apache.flink.core.fs.Path(target.store.url()),
                                        new SimpleStringEncoder<String>("UTF-8"))
                                .withBucketAssigner(new BasePathBucketAssigner<>())
                                .withRollingPolicy(OnCheckpointRollingPolicy.build())
                                .withOutputFileConfig(OutputFileConfig.builder().withPartPrefix("part").build())
                                .build())
                        .uid("sink").name("filesink-s3");
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
            case "twopc-fs-vf":
            case "twopc-fs-sinkfunction":
            case "filesink":
                return verifyFiles(dir, records);
            case "twopc-s3":
            case "filesink-s3":
                return verifyObjects(target.store, records);
            default:
                return verifyTable(Pg.parse(pgUrl), records);
        }
    }

    /**
     * Reads the bucket back through the S3 API (ListObjectsV2, GetObject) as a reader would: the
     * visible objects (names directly under the prefix not starting with {@code _} or {@code .})
     * must hold every record 1..N exactly once, each byte for byte. Multipart uploads left
     * incomplete are reported beside it (a sink should leave none after a finished job).
     */
    static String verifyObjects(Store store, long records) throws IOException {
        if (records > Integer.MAX_VALUE) {
            return "failed: more records than this check can count";
        }
        String root = store.prefix + "/";
        BitSet seen = new BitSet((int) records + 1);
        long lines = 0;
        long duplicates = 0;
        long outOfRange = 0;
        long malformed = 0;
        long bytes = 0;
        int objects = 0;
        byte[] expected = new byte[BenchRecords.LINE_BYTES];
        char[] scratch = new char[BenchRecords.RECORD_CHARS];
        byte[] line = new byte[BenchRecords.LINE_BYTES];
        byte[] chunk = new byte[1 << 20];
        for (BenchS3.ObjectInfo o : store.s3.list(store.bucket, root)) {
            String name = o.key.substring(root.length());
            if (name.startsWith("_") || name.startsWith(".") || name.contains("/")) {
                continue;
            }
            objects++;
            int fill = 0;
            try (InputStream in = store.s3.open(store.bucket, o.key)) {
                for (int n; (n = in.read(chunk)) > 0; ) {
                    bytes += n;
                    for (int i = 0; i < n; i++) {
                        line[fill++] = chunk[i];
                        if (fill < BenchRecords.LINE_BYTES && chunk[i] != '\n') {
                            continue;
                        }
                        lines++;
                        long id = fill == BenchRecords.LINE_BYTES ? parseId(line) : -1;
                        if (id < 0) {
                            malformed++;
                        } else if (id < 1 || id > records) {
                            outOfRange++;
                        } else {
                            BenchRecords.line(id, scratch, expected, 0);
                            if (!java.util.Arrays.equals(line, expected)) {
                                malformed++;
                            } else if (seen.get((int) id)) {
                                duplicates++;
                            } else {
                                seen.set((int) id);
                            }
                        }
                        fill = 0;
                    }
                }
            }
            if (fill > 0) {
                malformed++; // a truncated last line
            }
        }
        long distinct = seen.cardinality();
        int incomplete = store.s3.uploads(store.bucket, root).size();
        boolean ok = distinct == records && duplicates == 0 && outOfRange == 0 && malformed == 0;
        return (ok ? "ok: " : "failed: ") + distinct + " of " + records + " records exactly once (read back "
                + "through ListObjectsV2 + GetObject: " + objects + " objects, " + bytes + " bytes, " + lines
                + " lines), " + duplicates + " duplicates, " + (records - distinct) + " missing, " + malformed
                + " malformed, " + outOfRange + " out of range; " + incomplete
                + " multipart uploads left incomplete";
    }

    /** The id of a 100-byte record line, or -1 if its first 20 characters are not digits. */
    private static long parseId(byte[] line) {
        if (line[BenchRecords.LINE_BYTES - 1] != '\n') {
            return -1;
        }
        long id = 0;
        for (int i = 0; i < BenchRecords.ID_DIGITS; i++) {
            byte b = line[i];
            if (b < '0' || b > '9') {
                return -1;
            }
            id = id * 10 + (b - '0');
        }
        return id;
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
