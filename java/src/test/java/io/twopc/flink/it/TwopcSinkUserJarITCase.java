package io.twopc.flink.it;

import io.twopc.flink.TwopcSink;

import org.apache.flink.api.common.JobID;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.runtime.jobgraph.JobGraph;
import org.apache.flink.runtime.testutils.MiniClusterResourceConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import org.junit.ClassRule;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

import java.io.File;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import static io.twopc.flink.it.TwopcItSupport.*;
import static org.assertj.core.api.Assertions.assertThat;

/**
 * The sink shipped the way users ship it: the built jar (classes plus the JNI library) attached
 * to the job, so Flink loads {@code io.twopc.flink} child-first in a user-code classloader. The
 * first job restarts three times (Flink 1.20 keeps one classloader per job on a task manager
 * while the job holds slots, so its restarts reuse it); a second job of the same jar gets a new
 * classloader in the same JVM, where the test's own classloader has loaded the library as well.
 * The JVM refuses to load one library file into two classloaders, so each must load its own copy.
 */
public class TwopcSinkUserJarITCase {
    private static final String SINK_ID = "jarred";

    @ClassRule
    public static final MiniClusterWithClientResource CLUSTER = new MiniClusterWithClientResource(
            new MiniClusterResourceConfiguration.Builder()
                    .setNumberTaskManagers(1)
                    .setNumberSlotsPerTaskManager(2)
                    .build());

    @Rule
    public final TemporaryFolder tmp = new TemporaryFolder();

    /** The front end under test; the shim's subclass runs these tests through {@code addSink}. */
    protected FrontEnd frontEnd() {
        return FrontEnd.SINK_V2;
    }

    /** Per test: whether the sink class the tasks saw came from the user jar, not the test classpath. */
    static final Map<String, Set<Boolean>> SINK_FROM_USER_JAR = new ConcurrentHashMap<>();

    /** Records which copy of {@code TwopcSink} the user-code classloader resolves. */
    static final class SinkClassProbe extends RichMapFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String testName;

        SinkClassProbe(String testName) {
            this.testName = testName;
        }

        @Override
        public void open(OpenContext openContext) throws Exception {
            ClassLoader userCode = getRuntimeContext().getUserCodeClassLoader();
            Class<?> seen = Class.forName(TwopcSink.class.getName(), false, userCode);
            SINK_FROM_USER_JAR.computeIfAbsent(testName, k -> ConcurrentHashMap.newKeySet())
                    .add(seen != TwopcSink.class);
        }

        @Override
        public Long map(Long value) {
            return value;
        }
    }

    private static File userJar() {
        String path = System.getProperty("twopc.userJar");
        assertThat(path).as("system property twopc.userJar (set by build.gradle's test task)").isNotNull();
        File jar = new File(path);
        assertThat(jar).as("the built jar (gradle jar)").isFile();
        return jar;
    }

    private JobID submitWithUserJar(ClusterClient<?> client, Path output, String testName, int failingAttempts)
            throws Exception {
        StreamExecutionEnvironment env = environment(2, 100, failingAttempts + 2, Duration.ofMillis(100));
        frontEnd().attach(env.fromSequence(1, 30_000).uid("numbers")
                        // About 4 s of input: each failing attempt needs a completed
                        // checkpoint and 2,000 records of its own, restarts and all.
                        .map(new Throttle(4)).uid("throttle")
                        .map(new AttemptTracker(testName)).uid("attempts")
                        .map(new SinkClassProbe(testName)).uid("probe")
                        .map(new FailOnce(testName, 2_000, true, failingAttempts)).uid("injector"),
                b -> b.forDirectory(output).setSinkId(SINK_ID).setSerializationSchema(new DecimalLine()))
                .uid("twopc-sink");
        JobGraph jobGraph = env.getStreamGraph().getJobGraph();
        jobGraph.addJar(new org.apache.flink.core.fs.Path(userJar().toURI()));
        return client.submitJob(jobGraph).get(1, TimeUnit.MINUTES);
    }

    @Test
    public void nativeLibraryKeepsLoadingInUserClassloadersAcrossRestartsAndJobs() throws Exception {
        String test = "userJar";
        ClusterClient<?> client = CLUSTER.getClusterClient();
        // The test's classloader loads the library first, as a client-side tool would.
        io.twopc.flink.internal.NativeBridge.ensureLoaded();

        Path firstOutput = tmp.newFolder("first").toPath();
        JobID first = submitWithUserJar(client, firstOutput, test, 3);
        awaitSuccess(client, first);
        assertThat(injected(test)).as("injected failures (one per failing attempt)").hasSize(3);
        assertThat(maxAttempt(test)).as("restarts of the first job").isGreaterThanOrEqualTo(3);
        assertExactlyOnce(firstOutput, SINK_ID, 30_000);

        // A second job is a second user classloader in the same task manager JVM.
        Path secondOutput = tmp.newFolder("second").toPath();
        JobID second = submitWithUserJar(client, secondOutput, test + "-second", 1);
        awaitSuccess(client, second);
        assertExactlyOnce(secondOutput, SINK_ID, 30_000);

        assertThat(SINK_FROM_USER_JAR.get(test)).as("TwopcSink came from the user jar (child-first)")
                .containsExactly(true);
        assertThat(SINK_FROM_USER_JAR.get(test + "-second")).containsExactly(true);
        Set<Integer> loaders = ConcurrentHashMap.newKeySet();
        loaders.addAll(CLASSLOADERS.get(test));
        loaders.addAll(CLASSLOADERS.get(test + "-second"));
        System.out.printf("user-code classloaders: first job (%d attempts) %d, second job %d%n",
                maxAttempt(test) + 1, CLASSLOADERS.get(test).size(), CLASSLOADERS.get(test + "-second").size());
        assertThat(loaders).as("distinct user-code classloaders that ran the sink").hasSizeGreaterThanOrEqualTo(2);
    }
}
