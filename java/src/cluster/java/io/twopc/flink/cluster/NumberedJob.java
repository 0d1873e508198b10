package io.twopc.flink.cluster;

import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.configuration.ExternalizedCheckpointRetention;
import org.apache.flink.runtime.state.FunctionInitializationContext;
import org.apache.flink.runtime.state.FunctionSnapshotContext;
import org.apache.flink.streaming.api.checkpoint.CheckpointedFunction;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;

/**
 * The pipeline of the cluster test's user job, the same for both front ends: a replayable source
 * of the numbers {@code 0 .. records-1} ({@code fromSequence}, whose splits record their position
 * in each checkpoint), paced to a total rate, a keyed step with keyed state, and one line per
 * number into the sink. Every number must appear in the committed output exactly once, whatever
 * happens to the cluster; the test's reader checks that from the output files alone.
 *
 * <p>Checkpoints are exactly-once, every {@code --checkpoint-ms}, and retained on cancellation
 * (externalized), so a fresh cluster can resume from the last one after the whole cluster died.
 * The parallelism is not set here: it comes with the submission (REST {@code parallelism}), so a
 * restore can rescale. The restart strategy is the cluster's.
 *
 * <pre>
 * --output DIR --sink-id ID --records N [--rate PER_SECOND] [--checkpoint-ms MS]
 * [--rewind-policy FAIL|REPLACE_RANGE] [--fresh-start-policy FAIL|ABORT_PREPARED|APPEND]
 * [--sink-uid UID] [--hold FILE]
 * </pre>
 *
 * <p>{@code --hold FILE}: while FILE exists, the next checkpoint arms a hold: each subtask of the
 * step before the sink writes {@code FILE.armed-<subtask>} (the checkpoint id) and, from its next
 * record on, stops processing. The task thread (which the sink's writer and committer share) is
 * then busy, so the notification that this checkpoint completed is never handled: its prepared
 * transactions stay prepared, and the test can take the whole cluster down at that moment.
 */
public final class NumberedJob {
    public static final String SINK_NAME = "twopc-sink";
    public static final String SINK_UID = "twopc-sink";

    String output;
    String sinkId = "cluster";
    long records = -1;
    double rate = 2_000;
    long checkpointMs = 1_000;
    String rewindPolicy = "FAIL";
    String freshStartPolicy = "FAIL";
    String sinkUid = SINK_UID;
    String hold;

    private NumberedJob() {}

    static NumberedJob parse(String[] args) {
        NumberedJob job = new NumberedJob();
        for (int i = 0; i < args.length; i += 2) {
            if (i + 1 >= args.length) {
                throw new IllegalArgumentException("argument " + args[i] + " has no value");
            }
            String value = args[i + 1];
            switch (args[i]) {
                case "--output":
                    job.output = value;
                    break;
                case "--sink-id":
                    job.sinkId = value;
                    break;
                case "--records":
                    job.records = Long.parseLong(value);
                    break;
                case "--rate":
                    job.rate = Double.parseDouble(value);
                    break;
                case "--checkpoint-ms":
                    job.checkpointMs = Long.parseLong(value);
                    break;
                case "--rewind-policy":
                    job.rewindPolicy = value;
                    break;
                case "--fresh-start-policy":
                    job.freshStartPolicy = value;
                    break;
                case "--sink-uid":
                    job.sinkUid = value;
                    break;
                case "--hold":
                    job.hold = value;
                    break;
                default:
                    throw new IllegalArgumentException("unknown argument " + args[i]);
            }
        }
        if (job.output == null || job.records <= 0) {
            throw new IllegalArgumentException("--output and --records (> 0) are required");
        }
        return job;
    }

    String jobName(String frontEnd) {
        return "twopc cluster test (" + frontEnd + ", sink " + sinkId + ")";
    }

    StreamExecutionEnvironment environment() {
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.enableCheckpointing(checkpointMs);
        env.getCheckpointConfig().setExternalizedCheckpointRetention(
                ExternalizedCheckpointRetention.RETAIN_ON_CANCELLATION);
        // Fixed, so that key groups map the same way at every parallelism the test restores with.
        env.setMaxParallelism(128);
        return env;
    }

    DataStream<String> pipeline(StreamExecutionEnvironment env) {
        return env.fromSequence(0, records - 1).name("numbers").uid("numbers")
                .map(new Pace(rate)).name("pace").uid("pace")
                .keyBy(n -> n % 128)
                .process(new CountPerKey()).name("count-per-key").uid("count-per-key")
                .map(new Hold(hold)).name("hold").uid("hold");
    }

    /** Paces each subtask to its share of the total rate (chained to the source: no backlog). */
    static final class Pace extends RichMapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final double totalPerSecond;
        private transient double nanosPerRecord;
        private transient long start;
        private transient long seen;

        Pace(double totalPerSecond) {
            this.totalPerSecond = totalPerSecond;
        }

        @Override
        public void open(OpenContext openContext) {
            int parallelism = getRuntimeContext().getTaskInfo().getNumberOfParallelSubtasks();
            nanosPerRecord = 1e9 * parallelism / totalPerSecond;
            start = System.nanoTime();
        }

        @Override
        public Long map(Long value) throws InterruptedException {
            long due = start + (long) (++seen * nanosPerRecord);
            long ahead = due - System.nanoTime();
            if (ahead > 1_000_000) {
                Thread.sleep(ahead / 1_000_000);
            }
            return value;
        }
    }

    /** A keyed step with keyed state (rescaled with its key groups); passes each number on as a line. */
    static final class CountPerKey extends KeyedProcessFunction<Long, Long, String> {
        private static final long serialVersionUID = 1L;
        private transient ValueState<Long> count;

        @Override
        public void open(OpenContext openContext) {
            count = getRuntimeContext().getState(new ValueStateDescriptor<>("count", Types.LONG));
        }

        @Override
        public void processElement(Long value, Context ctx, Collector<String> out) throws IOException {
            Long seen = count.value();
            count.update(seen == null ? 1 : seen + 1);
            out.collect(Long.toString(value));
        }
    }

    /** See the class comment: {@code --hold}. Without a hold file it only passes lines on. */
    static final class Hold extends RichMapFunction<String, String> implements CheckpointedFunction {
        private static final long serialVersionUID = 1L;
        private final String holdFile;
        private transient long armedAt;

        Hold(String holdFile) {
            this.holdFile = holdFile;
        }

        @Override
        public void initializeState(FunctionInitializationContext context) {
            armedAt = -1;
        }

        @Override
        public void snapshotState(FunctionSnapshotContext context) throws IOException {
            if (holdFile != null && armedAt < 0 && Files.exists(Paths.get(holdFile))) {
                armedAt = context.getCheckpointId();
                int subtask = getRuntimeContext().getTaskInfo().getIndexOfThisSubtask();
                Path marker = Paths.get(holdFile + ".armed-" + subtask);
                Path tmp = Paths.get(marker + ".tmp");
                Files.write(tmp, (armedAt + "\n").getBytes(StandardCharsets.UTF_8));
                Files.move(tmp, marker, StandardCopyOption.ATOMIC_MOVE);
            }
        }

        @Override
        public String map(String value) throws InterruptedException {
            while (armedAt >= 0 && Files.exists(Paths.get(holdFile))) {
                Thread.sleep(50);
            }
            armedAt = -1;
            return value;
        }
    }
}
