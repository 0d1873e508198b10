package io.twopc.flink.it;

import io.twopc.flink.CsvRowSchema;
import io.twopc.flink.CommitOrder;
import io.twopc.flink.IoMode;
import io.twopc.flink.ObjectStoreDestination;
import io.twopc.flink.PostgresCopyFormat;
import io.twopc.flink.PostgresDestination;
import io.twopc.flink.RecordFormat;
import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcConfigException;
import io.twopc.flink.TwopcSink;
import io.twopc.flink.TwopcSinkBuilder;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.util.InstantiationUtil;

import org.junit.Test;

import java.nio.file.Paths;
import java.time.Duration;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/** {@link TwopcSinkBuilder#build()} rejects every setting that cannot work, saying what to change. */
public class TwopcSinkBuilderTest {

    private static TwopcSinkBuilder<String> valid() {
        return TwopcSink.<String>builder()
                .forDirectory("/data/out")
                .setSinkId("orders")
                .setSerializationSchema(new SimpleStringSchema());
    }

    private static String problemOf(TwopcSinkBuilder<String> builder) {
        try {
            builder.build();
        } catch (TwopcConfigException e) {
            assertThat(e.isFatal()).isTrue();
            return e.getMessage();
        }
        throw new AssertionError("build() accepted an invalid configuration");
    }

    @Test
    public void aValidConfigurationBuildsASerializableSink() throws Exception {
        TwopcSink<String> sink = valid()
                .setBatchSize(100)
                .setBatchBytes(64 * 1024)
                .setPartPrefix("orders")
                .setPartSuffix(".jsonl")
                .setRecordFormat(RecordFormat.LINES)
                .setRetention(Duration.ofHours(2))
                .setRestartAllowance(Duration.ofMinutes(5))
                .setCheckpointInterval(Duration.ofSeconds(30))
                .setCommitMaxAttempts(3)
                .setCommitRetryBackoff(Duration.ofMillis(50), Duration.ofSeconds(1))
                .build();
        assertThat(sink.getSinkId()).isEqualTo("orders");
        // Flink ships the function to the task managers by Java serialization.
        TwopcSink<String> copy = InstantiationUtil.clone(sink);
        assertThat(copy.getSinkId()).isEqualTo("orders");
        assertThat(copy.getOutputDirectory()).isEqualTo("/data/out");
    }

    @Test
    public void directoriesAreNormalizedAndFileUrisAccepted() {
        assertThat(valid().forDirectory("/data/./x/../out/").build().getOutputDirectory()).isEqualTo("/data/out");
        assertThat(valid().forDirectory("file:///data/out").build().getOutputDirectory()).isEqualTo("/data/out");
        assertThat(valid().forDirectory(Paths.get("/data/out")).build().getOutputDirectory()).isEqualTo("/data/out");
    }

    @Test
    public void requiredSettingsAreNamed() {
        String message = problemOf(TwopcSink.<String>builder());
        assertThat(message).contains("sink id is not set", "setSinkId", "output directory is not set",
                "forDirectory", "serialization schema is not set", "setSerializationSchema");
    }

    @Test
    public void sinkIdsAreSafeFileNameTokens() {
        assertThat(problemOf(valid().setSinkId("a/b"))).contains("contains '/'", "letters, digits");
        assertThat(problemOf(valid().setSinkId("a.b"))).contains("contains '.'");
        assertThat(problemOf(valid().setSinkId("_hidden"))).contains("must start with a letter or digit");
        assertThat(problemOf(valid().setSinkId("-x"))).contains("must start with a letter or digit");
        assertThat(problemOf(valid().setSinkId("x".repeat(65)))).contains("must be 1 to 64 characters long");
        assertThat(problemOf(valid().setSinkId(""))).contains("sink id is not set");
        valid().setSinkId("x".repeat(64)).build();
        valid().setSinkId("Orders_2024-eu").build();
    }

    @Test
    public void outputDirectoryMustBeAbsoluteAndLocal() {
        assertThat(problemOf(valid().forDirectory("out"))).contains("is relative", "absolute path");
        assertThat(problemOf(valid().forDirectory("hdfs://nn/out"))).contains("scheme 'hdfs'", "local or mounted",
                "s3://");
        assertThat(problemOf(valid().forDirectory("file://host/out"))).contains("names a host");
        assertThat(problemOf(valid().forDirectory("/"))).contains("the file system's root");
    }

    @Test
    public void anObjectStoreIsCheckedUpFront() {
        // s3:// where a directory goes: the object store with AWS's defaults.
        TwopcSink<String> viaDirectory = valid().forDirectory("s3://my-bucket/out").build();
        assertThat(viaDirectory.getOptions().objectStore().url()).isEqualTo("s3://my-bucket/out");
        assertThat(viaDirectory.getOutputDirectory()).isNull();
        assertThat(viaDirectory.getOptions().toConfigJson()).contains("\"type\":\"s3\"",
                "\"url\":\"s3://my-bucket/out\"");
        ObjectStoreDestination store = ObjectStoreDestination.s3("s3://my-bucket/out");
        TwopcSinkBuilder<String> noDirectory = TwopcSink.<String>builder()
                .setSinkId("orders")
                .setSerializationSchema(new SimpleStringSchema());
        assertThat(problemOf(noDirectory.forObjectStore(store.partSize(1024))))
                .contains("part size 1024 bytes must be between 5 MiB");
        assertThat(problemOf(noDirectory.forObjectStore(store.endpoint("http://127.0.0.1:9000"))))
                .contains("plain http", "allowHttp(true)");
        assertThat(problemOf(noDirectory.forObjectStore(store.savepointRetention(Duration.ofDays(-1)))))
                .contains("savepoint retention must be zero or more");
        assertThat(problemOf(noDirectory.forObjectStore(store.savepointRetention(Duration.ofSeconds(Long.MAX_VALUE)))))
                .contains("savepoint retention", "too large");
        assertThat(problemOf(noDirectory.forObjectStore(ObjectStoreDestination.s3("s3://A_B/out"))))
                .contains("bucket name");
        assertThat(problemOf(noDirectory.forObjectStore(ObjectStoreDestination.s3("gs://b/out"))))
                .contains("must start with s3://");
        assertThat(problemOf(valid().forObjectStore(store))).contains("are both set");
        assertThat(problemOf(noDirectory.forObjectStore(store).setIoMode(IoMode.DIRECT)))
                .contains("I/O mode applies to a directory only");
        assertThat(problemOf(noDirectory.forObjectStore(store).setCommitOrder(CommitOrder.VISIBLE_FIRST)))
                .contains("commit order applies to a directory only", "setCommitOrder");
        // Settings that mean something to an object store pass into its configuration.
        TwopcSink<String> sink = noDirectory.forObjectStore(store.endpoint("http://127.0.0.1:9000").allowHttp(true)
                        .pathStyleAccess(true).region("eu-west-1").savepointRetention(Duration.ofDays(30)))
                .setIoMode(IoMode.AUTO)
                .setCommitOrder(CommitOrder.DURABLE_FIRST)
                .setPartSuffix(".csv")
                .build();
        assertThat(sink.getOptions().toConfigJson()).contains("\"pathStyle\":true", "\"allowHttp\":true",
                "\"region\":\"eu-west-1\"", "\"savepointRetentionMs\":2592000000", "\"partSuffix\":\".csv\"");
        assertThat(sink.getOptions().toString()).contains("s3://my-bucket/out at http://127.0.0.1:9000");
    }

    @Test
    public void sizesMustBePositiveAndBounded() {
        assertThat(problemOf(valid().setBatchSize(0))).contains("batch size 0 must be between 1 and");
        assertThat(problemOf(valid().setBatchBytes(-1))).contains("batch bytes -1 must be between 1 and");
        assertThat(problemOf(valid().setBatchBytes(Integer.MAX_VALUE))).contains("256 MiB");
        assertThat(problemOf(valid().setCommitMaxAttempts(0))).contains("commit max attempts must be at least 1");
    }

    @Test
    public void retentionMustOutlastARestart() {
        String message = problemOf(valid()
                .setRetention(Duration.ofSeconds(60))
                .setCheckpointInterval(Duration.ofSeconds(30))
                .setRestartAllowance(Duration.ofSeconds(10)));
        assertThat(message).contains("retention of 1min is shorter than two checkpoint intervals",
                "at least 70s");
        assertThat(problemOf(valid().setRetention(Duration.ZERO))).contains("retention must not be 0");
        assertThat(problemOf(valid().setRestartAllowance(Duration.ofSeconds(-1)))).contains("is negative");
        assertThat(problemOf(valid().setRetention(Duration.ofSeconds(Long.MAX_VALUE)))).contains("too large");
    }

    @Test
    public void waitsMustBeGivenAndNotNegative() {
        assertThat(problemOf(valid().setLineageWait(Duration.ofSeconds(-1)))).contains("lineage wait PT-1S is negative");
        assertThat(problemOf(valid().setLineageWait(null))).contains("lineage wait is null");
        assertThat(problemOf(valid().setOwnerWait(Duration.ofSeconds(-1)))).contains("owner wait PT-1S is negative");
    }

    @Test
    public void partNamesAndPoliciesAreChecked() {
        assertThat(problemOf(valid().setPartSuffix("txt"))).contains("must start with '.'");
        assertThat(problemOf(valid().setPartSuffix(".t/x"))).contains("contains '/'");
        assertThat(problemOf(valid().setPartPrefix(".hidden"))).contains("part prefix");
        assertThat(problemOf(valid().setRewindPolicy(null))).contains("RewindPolicy.REPLACE_RANGE");
        assertThat(problemOf(valid().setFreshStartPolicy(null))).contains("FreshStartPolicy.ABORT_PREPARED");
        assertThat(problemOf(valid().setRecordFormat(null))).contains("RecordFormat.RAW");
        assertThat(problemOf(valid().setCommitOrder(null))).contains("CommitOrder.VISIBLE_FIRST");
        // A directory takes either order, and the configuration carries it to the native side.
        assertThat(valid().setCommitOrder(CommitOrder.VISIBLE_FIRST).build().getOptions().toConfigJson())
                .contains("\"commitOrder\":\"VISIBLE_FIRST\"");
        assertThat(valid().build().getOptions().toConfigJson()).contains("\"commitOrder\":\"DURABLE_FIRST\"");
        assertThat(problemOf(valid().setCommitRetryBackoff(Duration.ofSeconds(2), Duration.ofSeconds(1))))
                .contains("the initial commit back-off (2s) exceeds the maximum back-off (1s)");
        assertThat(problemOf(valid().setTimeoutWarningRatio(1.5))).contains("must be in [0, 1]");
    }

    private static TwopcSinkBuilder<Object[]> validPostgres() {
        return TwopcSink.<Object[]>forPostgres(PostgresDestination.url("postgres://app@db.example:5432/shop")
                        .passwordFromEnvironment("SHOP_DB_PASSWORD")
                        .table("public.orders")
                        .columns("id", "customer"))
                .setSinkId("orders")
                .setSerializationSchema(CsvRowSchema.forArrays());
    }

    private static String problemOfPostgres(TwopcSinkBuilder<Object[]> builder) {
        try {
            builder.build();
        } catch (TwopcConfigException e) {
            return e.getMessage();
        }
        throw new AssertionError("build() accepted an invalid configuration");
    }

    /**
     * Settings that can never work are refused by build(), naming the setting, instead of at
     * every task start or as a parser's words: a commit attempt count below 1, a retention that
     * does not outlast the restart allowance, REPLACE_RANGE with PostgreSQL's idempotent mode, TLS
     * or a connect_timeout in the connection.
     */
    @Test
    public void settingsThatCannotWorkAreRefusedWhenBuilt() {
        assertThat(problemOf(valid().setCommitMaxAttempts(-1))).contains("commit max attempts must be at least 1",
                "not -1");
        assertThat(problemOf(valid().setRetention(Duration.ofMinutes(5))))
                .contains("retention 5min is not longer than the restart allowance (10min)");
        valid().setRetention(Duration.ofMinutes(5)).setRestartAllowance(Duration.ofMinutes(1)).build();
        assertThat(problemOfPostgres(TwopcSink.<Object[]>forPostgres(
                        PostgresDestination.url("postgres://app@db.example:5432/shop")
                                .table("public.orders").columns("id", "customer").idempotent("id"))
                .setSinkId("orders").setSerializationSchema(CsvRowSchema.forArrays())
                .setRewindPolicy(RewindPolicy.REPLACE_RANGE)))
                .contains("REPLACE_RANGE applies to PostgreSQL's transactional mode only");
        assertThat(problemOfPostgres(validPostgres().forPostgres(
                PostgresDestination.url("postgres://app@db.example:5432/shop?sslmode=require")
                        .table("public.orders").columns("id", "customer"))))
                .contains("TLS");
        // A libpq connect_timeout is replaced by the sink's own (with a warning), not refused.
        validPostgres().forPostgres(PostgresDestination.url("postgres://app@db.example:5432/shop?connect_timeout=60")
                .table("public.orders").columns("id", "customer")).build();
        assertThat(problemOfPostgres(validPostgres().forPostgres(
                PostgresDestination.url("postgres://app@db.example:5432/shop")
                        .table("public.orders").columns("id", "customer").connectTimeout(Duration.ofNanos(500_000)))))
                .contains("connect timeout PT0.0005S must be at least 1 ms");
        // Too large to count in milliseconds: refused by name, not an ArithmeticException.
        assertThat(problemOfPostgres(validPostgres().forPostgres(
                PostgresDestination.url("postgres://app@db.example:5432/shop")
                        .table("public.orders").columns("id", "customer")
                        .connectTimeout(java.time.temporal.ChronoUnit.FOREVER.getDuration()))))
                .contains("connect timeout", "too large");
    }

    @Test
    public void aPostgresSinkBuildsSerializableAndNeverShowsAPassword() throws Exception {
        TwopcSink<Object[]> sink = validPostgres().build();
        TwopcSink<Object[]> copy = InstantiationUtil.clone(sink);
        assertThat(copy.getSinkId()).isEqualTo("orders");
        assertThat(copy.getOutputDirectory()).isNull();
        validPostgres().forPostgres(PostgresDestination.host("db", 5432, "shop", "app").table("t").columns("a")
                .idempotent("a")).build();

        String refused = problemOfPostgres(validPostgres()
                .forPostgres(PostgresDestination.url("postgres://app:hunter2@db/shop").table("t").columns("a")));
        assertThat(refused).contains("carries a password", "passwordFromEnvironment").doesNotContain("hunter2");
    }

    @Test
    public void postgresSettingsAreCheckedByBuild() {
        assertThat(problemOfPostgres(validPostgres().forDirectory("/data/out")))
                .contains("both an output directory and a PostgreSQL destination");
        assertThat(problemOfPostgres(validPostgres().setCommitOrder(CommitOrder.VISIBLE_FIRST)))
                .contains("commit order applies to forDirectory only", "setCommitOrder");
        assertThat(problemOfPostgres(validPostgres().setPartSuffix(".csv")))
                .contains("part suffix applies to forDirectory only", "remove setPartSuffix");
        assertThat(problemOfPostgres(validPostgres().setRecordFormat(RecordFormat.RAW)))
                .contains("record format applies to forDirectory only");
        assertThat(problemOfPostgres(validPostgres().forPostgres(PostgresDestination.url("postgres://app@db/shop")
                        .table("t").columns("a").copyFormat(PostgresCopyFormat.TEXT))))
                .contains("CsvRowSchema but the PostgreSQL COPY format is TEXT");
        assertThat(problemOfPostgres(validPostgres().setRewindPolicy(RewindPolicy.REPLACE_RANGE)))
                .contains("REPLACE_RANGE needs a transaction-id column on PostgreSQL");
        validPostgres().setRewindPolicy(RewindPolicy.REPLACE_RANGE).forPostgres(
                PostgresDestination.url("postgres://app@db/shop").table("t").columns("a").transactionIdColumn("txn"))
                .build();
        String several = problemOfPostgres(validPostgres().setBatchSize(0).forPostgres(
                PostgresDestination.url("postgres://app@db/shop").columns("a", "a").idempotent()));
        assertThat(several).contains("(1)", "batch size 0", "table is not set", "listed twice",
                "idempotent mode needs key columns");
    }

    @Test
    public void everyProblemIsReportedAtOnce() {
        // Every problem the builder sees on its own, at once; the core's rules (sink id, paths,
        // retention) are checked once those are fixed.
        String message = problemOf(valid().setBatchSize(-5).setBatchBytes(0).setTimeoutWarningRatio(2));
        assertThat(message).contains("(1) batch size -5", "(2) batch bytes 0", "(3) timeout warning ratio 2.0");
        assertThat(problemOf(valid().setSinkId("bad id"))).contains("sink id", "' '");
    }

    @Test
    public void theFirstProblemFailsBuildWithTheConfigExceptionType() {
        assertThatThrownBy(() -> valid().setBatchSize(0).build())
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageStartingWith("cannot build TwopcSink 'orders': batch size 0");
    }
}
