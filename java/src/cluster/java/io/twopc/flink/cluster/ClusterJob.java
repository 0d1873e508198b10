package io.twopc.flink.cluster;

import io.twopc.flink.FreshStartPolicy;
import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * The cluster test's user job through the Sink V2 front end: {@code stream.sinkTo(TwopcSink)}.
 * Packaged with the twopc jar inside (Flink {@code provided}) and submitted over REST to a session
 * cluster by {@code scripts/cluster-test.sh}, on Flink 1.20 and 2.x. See {@link NumberedJob} for
 * the pipeline and the arguments.
 */
public final class ClusterJob {
    private ClusterJob() {}

    public static void main(String[] args) throws Exception {
        NumberedJob job = NumberedJob.parse(args);
        StreamExecutionEnvironment env = job.environment();
        DataStream<String> lines = job.pipeline(env);
        lines.sinkTo(TwopcSink.<String>forDirectory(job.output)
                        .setSinkId(job.sinkId)
                        .setSerializationSchema(new SimpleStringSchema())
                        .setRewindPolicy(RewindPolicy.valueOf(job.rewindPolicy))
                        .setFreshStartPolicy(FreshStartPolicy.valueOf(job.freshStartPolicy))
                        .build())
                .name(NumberedJob.SINK_NAME)
                .uid(job.sinkUid);
        env.execute(job.jobName("Sink V2"));
    }
}
