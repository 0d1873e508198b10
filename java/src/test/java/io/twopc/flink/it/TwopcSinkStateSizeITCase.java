package io.twopc.flink.it;

import org.apache.flink.api.common.JobID;
import org.apache.flink.runtime.checkpoint.AbstractCheckpointStats;
import org.apache.flink.runtime.checkpoint.CompletedCheckpointStats;
import org.apache.flink.runtime.checkpoint.TaskStateStats;
import org.apache.flink.runtime.executiongraph.AccessExecutionJobVertex;
import org.apache.flink.runtime.executiongraph.ArchivedExecutionGraph;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.nio.file.Path;
import java.time.Duration;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The sink's checkpoint state has the same size whatever the maximum parallelism: one small
 * element per subtask (its writer state; for the SinkFunction shim also Flink's own pending
 * handles), never copies per key group. Measured from Flink's checkpoint statistics of the sink's
 * writer vertex at maxParallelism 128 and 32768.
 */
public class TwopcSinkStateSizeITCase {
    private static final String SINK_ID = "sized";
    private static final InMemoryReporter METRICS = InMemoryReporter.createWithRetainedMetrics();

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = cluster(METRICS, 2);

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    /** The front end under test; the shim's subclass runs this through {@code addSink}. */
    protected FrontEnd frontEnd() {
        return FrontEnd.SINK_V2;
    }

    /** State bytes of the sink's writer vertex in the job's last completed checkpoint. */
    private long sinkStateBytes(int maxParallelism) throws Exception {
        Path output = tmp.newFolder("out-" + maxParallelism).toPath();
        StreamExecutionEnvironment env = environment(1, 100, 0, Duration.ofMillis(100));
        env.setMaxParallelism(maxParallelism);
        // Each operator its own vertex, so the sink's state is measured alone.
        env.disableOperatorChaining();
        frontEnd().attach(env.fromSequence(1, 5_000).map(new Throttle(5)),
                        b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine()))
                .uid("twopc-sink").name("twopc-sink");
        JobID jobId = submit(CLUSTER.getClusterClient(), env, null);
        awaitSuccess(CLUSTER.getClusterClient(), jobId);
        assertExactlyOnce(output, SINK_ID, 5_000);

        ArchivedExecutionGraph graph = CLUSTER.getMiniCluster().getArchivedExecutionGraph(jobId)
                .get(1, TimeUnit.MINUTES);
        // The largest state the sink's writer vertex reported in any completed checkpoint (the
        // final one, after the end of input, may hold nothing: finished subtasks report none).
        long bytes = -1;
        String names = "";
        for (AccessExecutionJobVertex vertex : graph.getVerticesTopologically()) {
            names += " [" + vertex.getName() + "]";
            // "twopc-sink: Writer" for Sink V2; "Sink: twopc-sink" for the SinkFunction.
            if (vertex.getName().contains("twopc-sink") && !vertex.getName().contains("Committer")) {
                for (AbstractCheckpointStats checkpoint
                        : graph.getCheckpointStatsSnapshot().getHistory().getCheckpoints()) {
                    if (checkpoint instanceof CompletedCheckpointStats) {
                        TaskStateStats stats = checkpoint.getTaskStateStats(vertex.getJobVertexId());
                        if (stats != null) {
                            bytes = Math.max(bytes, stats.getStateSize());
                        }
                    }
                }
            }
        }
        assertThat(bytes).as("state of the sink's writer vertex among%s", names).isGreaterThanOrEqualTo(0);
        assertThat(bytes).as("the sink's writer vertex reported state").isGreaterThan(0);
        return bytes;
    }

    @Test
    public void checkpointStateDoesNotGrowWithTheMaxParallelism() throws Exception {
        long small = sinkStateBytes(128);
        long large = sinkStateBytes(32_768);
        System.out.printf("%s sink state per checkpoint, parallelism 1: %d bytes at maxParallelism 128, "
                + "%d bytes at maxParallelism 32768%n", frontEnd(), small, large);
        // One writer state (and, for the shim, its pending handles), not one copy per key group:
        // the old layout held about 3.5 MB at 32768.
        assertThat(large).as("state bytes at maxParallelism 32768 vs 128").isLessThanOrEqualTo(small + 64);
        assertThat(large).as("state bytes at maxParallelism 32768").isLessThan(4_096);
    }
}
