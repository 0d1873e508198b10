package io.twopc.flink.table;

import io.twopc.flink.it.TwopcItSupport;

import org.apache.flink.api.common.JobID;
import org.apache.flink.core.execution.JobClient;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.table.api.bridge.java.StreamTableEnvironment;
import org.apache.flink.table.functions.ScalarFunction;
import org.apache.flink.types.Row;
import org.apache.flink.util.CloseableIterator;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.BooleanSupplier;

/**
 * What the SQL connector's tests share: table environments on the test MiniCluster (streaming,
 * with checkpoints and a bounded restart strategy), a failure injected from inside a query, and
 * running an {@code INSERT INTO} to its end.
 *
 * <p>The MiniCluster runs in this JVM and loads these test classes through the test's class
 * loader, so the static maps below are shared between the test thread and the query's functions.
 */
final class SqlTestSupport {
    private SqlTestSupport() {}

    /** A streaming table environment: parallelism 2, a checkpoint every {@code checkpointMs}. */
    static StreamTableEnvironment streaming(int parallelism, long checkpointMs) {
        StreamExecutionEnvironment env =
                TwopcItSupport.environment(parallelism, checkpointMs, 4, Duration.ofMillis(200));
        StreamTableEnvironment tEnv = StreamTableEnvironment.create(env, EnvironmentSettings.inStreamingMode());
        tEnv.createTemporarySystemFunction("FAIL_ONCE", FailOnce.class);
        return tEnv;
    }

    /** A batch table environment, to read tables back. */
    static TableEnvironment batch() {
        return TableEnvironment.create(EnvironmentSettings.inBatchMode());
    }

    /** Every row of {@code query}. */
    static List<Row> collect(TableEnvironment tEnv, String query) throws Exception {
        List<Row> rows = new ArrayList<>();
        try (CloseableIterator<Row> it = tEnv.executeSql(query).collect()) {
            it.forEachRemaining(rows::add);
        }
        return rows;
    }

    /** Runs a statement that submits a job and waits for the job to finish; fails the test if it failed. */
    static JobID runToEnd(TableResult result) throws Exception {
        JobClient job = result.getJobClient().orElseThrow(() -> new AssertionError("the statement ran no job"));
        try {
            job.getJobExecutionResult().get(TwopcItSupport.JOB_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            throw new AssertionError("job " + job.getJobID() + " failed", e.getCause());
        }
        return job.getJobID();
    }

    /** The job's failure; fails the test if it finished. */
    static Throwable runToFailure(TableResult result) throws Exception {
        JobClient job = result.getJobClient().orElseThrow(() -> new AssertionError("the statement ran no job"));
        try {
            job.getJobExecutionResult().get(TwopcItSupport.JOB_TIMEOUT.toMillis(), TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.ExecutionException e) {
            return e.getCause();
        }
        throw new AssertionError("job " + job.getJobID() + " should have failed");
    }

    static void waitUntil(String what, BooleanSupplier condition) throws InterruptedException {
        TwopcItSupport.waitUntil(what, TwopcItSupport.JOB_TIMEOUT, condition);
    }

    /** Armed failures, by name: the next row {@link FailOnce} sees under that name throws, once. */
    static final Map<String, AtomicBoolean> ARMED = new ConcurrentHashMap<>();
    /** What {@link FailOnce} threw, by name. */
    static final Map<String, List<String>> FIRED = new ConcurrentHashMap<>();

    /** Makes the next row of {@code FAIL_ONCE(name, ...)} fail its task (once). */
    static void arm(String name) {
        ARMED.computeIfAbsent(name, k -> new AtomicBoolean()).set(true);
    }

    static List<String> fired(String name) {
        return FIRED.getOrDefault(name, Collections.emptyList());
    }

    /**
     * {@code FAIL_ONCE(name, value)} returns {@code value}, except that once {@link #arm armed} for
     * {@code name} the next call throws (and disarms): a failure injected mid-query, when the test
     * decides (e.g. after output was committed).
     */
    public static final class FailOnce extends ScalarFunction {
        private static final long serialVersionUID = 1L;

        @Override
        public boolean isDeterministic() {
            return false;
        }

        public Long eval(String name, Long value) {
            AtomicBoolean armed = ARMED.get(name);
            if (armed != null && armed.compareAndSet(true, false)) {
                String what = "injected failure at value " + value;
                FIRED.computeIfAbsent(name, k -> Collections.synchronizedList(new ArrayList<>())).add(what);
                throw new RuntimeException("FAIL_ONCE(" + name + "): " + what);
            }
            return value;
        }
    }
}
