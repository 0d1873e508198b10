package io.twopc.flink.cluster;

import io.twopc.flink.FreshStartPolicy;
import io.twopc.flink.RewindPolicy;
import io.twopc.flink.TwopcSinkFunction;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * The cluster test's user job through the SinkFunction shim: {@code
 * stream.addSink(TwopcSinkFunction)}, Flink 1.20 only. Same pipeline and arguments as {@link
 * ClusterJob}.
 */
public final class ClusterSinkFunctionJob {
    private ClusterSinkFunctionJob() {}

    public static void main(String[] args) throws Exception {
        NumberedJob job = NumberedJob.parse(args);
        StreamExecutionEnvironment env = job.environment();
        DataStream<String> lines = job.pipeline(env);
        lines.addSink(TwopcSinkFunction.<String>forDirectory(job.output)
                        .setSinkId(job.sinkId)
                        .setSerializationSchema(new SimpleStringSchema())
                        .setRewindPolicy(RewindPolicy.valueOf(job.rewindPolicy))
                        .setFreshStartPolicy(FreshStartPolicy.valueOf(job.freshStartPolicy))
                        .build())
                .name(NumberedJob.SINK_NAME)
                .uid(job.sinkUid);
        env.execute(job.jobName("SinkFunction"));
    }
}
