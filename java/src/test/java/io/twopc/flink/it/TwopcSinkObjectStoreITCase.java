package io.twopc.flink.it;

import io.twopc.flink.ObjectStoreDestination;
import io.twopc.flink.TwopcSinkBuilderBase;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.After;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TestName;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The sink on an S3-compatible object store: the local moto server of the test command ({@code
 * TWOPC_S3_ENDPOINT}), on Flink 1.20 and 2.x (the shim's subclass runs it through {@code addSink}
 * on 1.20). Numbers {@code 1..N} go through two subtasks with frequent checkpoints and a failure
 * injected after a checkpoint completed; the bucket is then read back through the plain S3 API,
 * as any reader of it would: every number exactly once, in objects named {@code part-*}, and no
 * multipart upload left incomplete. A bucket whose lifecycle rule would abort the sink's prepared
 * uploads too soon is refused at start, naming the rule.
 */
public class TwopcSinkObjectStoreITCase {
    private static final String SINK_ID = "numbers";
    private static final String PREFIX = "it/out";
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 4);

    @Rule
    public final TestName name = new TestName();

    private static TestS3 s3;

    @BeforeClass
    public static void server() {
        s3 = TestS3.fromEnvironment();
    }

    @Before
    @After
    public void resetFailPoints() {
        clearFailPoints();
    }

    /** The front end under test; the shim's subclass runs these tests through {@code addSink}. */
    protected FrontEnd frontEnd() {
        return FrontEnd.SINK_V2;
    }

    private String test() {
        return getClass().getSimpleName() + "." + name.getMethodName();
    }

    private static ObjectStoreDestination store(String bucket) {
        return ObjectStoreDestination.s3("s3://" + bucket + "/" + PREFIX)
                .endpoint(s3.endpoint)
                .pathStyleAccess(true)
                .allowHttp(true);
    }

    private void numberedJob(StreamExecutionEnvironment env, long count, ObjectStoreDestination store,
            FailOnce injector) {
        // About 3 s of input per 30,000 records: a failure after a completed checkpoint (written
        // to the object store) still finds records left to fail on.
        frontEnd().attach(numberedStream(env, count, 5, test(), injector),
                (TwopcSinkBuilderBase<Long, ?> b) -> b.forObjectStore(store)
                        .setSinkId(SINK_ID)
                        .setSerializationSchema(new DecimalLine())
                        .setPartSuffix(".txt")
                        .setBatchSize(500)
                        .setCommitRetryBackoff(Duration.ofMillis(10), Duration.ofMillis(100)))
                .uid("twopc-sink").name("twopc-sink");
    }

    /** Every line of every visible object under the prefix, read through the S3 API. */
    private static List<String> readBack(String bucket) throws Exception {
        List<String> lines = new ArrayList<>();
        for (String key : s3.keys(bucket, PREFIX + "/")) {
            String name = key.substring(PREFIX.length() + 1);
            if (name.startsWith("_twopc/")) {
                continue; // the sink's control objects: readers skip names starting with '_'
            }
            assertThat(name).as("a visible object of the sink").startsWith("part-" + SINK_ID + ".").endsWith(".txt");
            String text = new String(s3.get(bucket, key), StandardCharsets.UTF_8);
            lines.addAll(Arrays.asList(text.split("\n")));
        }
        return lines;
    }

    @Test
    public void everyRecordIsCommittedOnceWithAFailureAfterACheckpoint() throws Exception {
        String bucket = s3.newBucket("twopc-it");
        long count = 30_000;
        StreamExecutionEnvironment env = environment(2, 100, 3, Duration.ofMillis(100));
        numberedJob(env, count, store(bucket), new FailOnce(test(), 10_000, true, 1));

        JobID jobId = submit(CLUSTER.getClusterClient(), env, null);
        awaitSuccess(CLUSTER.getClusterClient(), jobId);

        assertThat(injected(test())).as("the injected failure").hasSize(1);
        assertThat(maxAttempt(test())).as("restarts").isGreaterThanOrEqualTo(1);
        assertAllOnce("S3 ListObjectsV2 + GetObject", readBack(bucket), count);
        assertThat(s3.openUploads(bucket, PREFIX + "/")).as("multipart uploads left incomplete").isEmpty();
        assertThat(sumMetric(METRICS, jobId, "twopc.recordsWritten")).isGreaterThanOrEqualTo(count);
    }

    @Test
    public void aLifecycleRuleThatAbortsUploadsTooSoonIsRefusedAtStart() throws Exception {
        String bucket = s3.newBucket("twopc-it");
        s3.putLifecycle(bucket, "<LifecycleConfiguration><Rule><ID>tidy-uploads</ID><Filter><Prefix>it/</Prefix>"
                + "</Filter><Status>Enabled</Status><AbortIncompleteMultipartUpload><DaysAfterInitiation>1"
                + "</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule></LifecycleConfiguration>");
        StreamExecutionEnvironment env = environment(2, 100, 0, Duration.ofMillis(100));
        numberedJob(env, 1_000, store(bucket).savepointRetention(Duration.ofDays(30)), null);

        JobID jobId = submit(CLUSTER.getClusterClient(), env, null);
        JobResult result = awaitResult(CLUSTER.getClusterClient(), jobId);

        assertThat(result.isSuccess()).as("the job must not run").isFalse();
        Optional<Throwable> error = result.getSerializedThrowable()
                .map(t -> t.deserializeError(getClass().getClassLoader()));
        StringBuilder messages = new StringBuilder();
        for (Throwable t = error.orElse(null); t != null; t = t.getCause()) {
            messages.append(t.getMessage()).append('\n');
        }
        assertThat(messages.toString()).contains("tidy-uploads").contains("1 day").contains("DaysAfterInitiation");
        assertThat(readBack(bucket)).as("nothing written").isEmpty();
    }
}
