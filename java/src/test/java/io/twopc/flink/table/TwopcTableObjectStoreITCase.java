package io.twopc.flink.table;

import io.twopc.flink.it.TestS3;
import io.twopc.flink.it.TwopcItSupport;

import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.ValidationException;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TestName;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

import static io.twopc.flink.it.TwopcItSupport.assertAllOnce;
import static io.twopc.flink.table.SqlTestSupport.*;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

/**
 * The SQL connector on an S3-compatible object store ({@code 'path' = 's3://bucket/prefix'}, the
 * local moto server of the test command), on Flink 1.20 and 2.x: {@code INSERT INTO} from {@code
 * datagen} with a failure injected once output was committed, then the bucket read back through
 * the S3 API holds every row exactly once. Object-store options on a directory table are refused.
 */
public class TwopcTableObjectStoreITCase {
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = TwopcItSupport.cluster(METRICS, 4);

    @Rule
    public final TestName name = new TestName();

    private static TestS3 s3;

    @BeforeClass
    public static void server() {
        s3 = TestS3.fromEnvironment();
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    private static List<String> visibleLines(String bucket, String prefix) throws Exception {
        List<String> lines = new ArrayList<>();
        for (String key : s3.keys(bucket, prefix + "/")) {
            if (key.substring(prefix.length() + 1).startsWith("_")) {
                continue;
            }
            for (String line : new String(s3.get(bucket, key), StandardCharsets.UTF_8).split("\n")) {
                lines.add(line);
            }
        }
        return lines;
    }

    @Test
    public void csvFromDatagenWithAFailureAfterACommitIsExactlyOnce() throws Exception {
        long count = 20_000;
        String bucket = s3.newBucket("twopc-sql");
        StreamTableEnvironment tEnv = streaming(2, 200);
        tEnv.executeSql("CREATE TEMPORARY TABLE numbers (id BIGINT, body STRING) WITH ("
                + "'connector' = 'datagen', 'rows-per-second' = '5000', "
                + "'fields.id.kind' = 'sequence', 'fields.id.start' = '1', 'fields.id.end' = '" + count + "', "
                + "'fields.body.length' = '12')");
        tEnv.executeSql("CREATE TABLE sink_s3 (id BIGINT, body STRING) WITH ("
                + "'connector' = 'twopc', 'sink-id' = 'sql-s3', 'path' = 's3://" + bucket + "/sql', "
                + "'format' = 'csv', 's3.endpoint' = '" + s3.endpoint + "', 's3.path-style-access' = 'true', "
                + "'s3.allow-http' = 'true', 'sink.part-suffix' = '.csv', 'sink.batch-size' = '300')");
        TableResult result = tEnv.executeSql("INSERT INTO sink_s3 SELECT FAIL_ONCE('" + test() + "', id), body "
                + "FROM numbers");

        waitUntil("a committed object", () -> {
            try {
                return !visibleLines(bucket, "sql").isEmpty();
            } catch (Exception e) {
                return false;
            }
        });
        arm(test());
        runToEnd(result);
        assertThat(fired(test())).as("the injected failure").hasSize(1);

        List<String> lines = visibleLines(bucket, "sql");
        List<String> ids = new ArrayList<>();
        for (String l : lines) {
            ids.add(l.substring(0, l.indexOf(',')));
        }
        assertAllOnce("S3 ListObjectsV2 + GetObject", ids, count);
        assertThat(s3.keys(bucket, "sql/")).filteredOn(k -> !k.startsWith("sql/_"))
                .allSatisfy(k -> assertThat(k).startsWith("sql/part-sql-s3.").endsWith(".csv"));
        assertThat(s3.openUploads(bucket, "sql/")).as("multipart uploads left incomplete").isEmpty();
    }

    @Test
    public void objectStoreOptionsOnADirectoryTableAreRefused() {
        StreamTableEnvironment tEnv = streaming(1, 200);
        tEnv.executeSql("CREATE TABLE t (id BIGINT) WITH ('connector' = 'twopc', 'sink-id' = 's', "
                + "'path' = '/tmp/twopc-never', 'format' = 'csv', 's3.region' = 'eu-west-1')");
        assertThatThrownBy(() -> tEnv.executeSql("INSERT INTO t VALUES (1)"))
                .hasRootCauseInstanceOf(ValidationException.class)
                .rootCause()
                .hasMessageContaining("'s3.region'")
                .hasMessageContaining("s3://");
    }
}
