package io.twopc.flink.internal;

import static org.assertj.core.api.Assertions.assertThat;

import java.io.File;

import org.apache.flink.testutils.logging.TestLoggerResource;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;
import org.slf4j.event.Level;

/** Rust `log` records reach SLF4J under twopc.* logger names. */
public class NativeLogTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    @Test
    public void aSinkOpenLogsThroughSlf4j() throws Throwable {
        NativeBridge.ensureLoaded();
        File out = tmp.newFolder("out");
        // The core logs its start-up at INFO from module twopc_core::sink.
        try (TestLoggerResource.SingleTestResource log =
                TestLoggerResource.asSingleTestResource("twopc.core", Level.INFO)) {
            long sink = NativeTestSupport.open(out, "logged-sink");
            NativeBridge.close(sink);
            assertThat(log.getMessages())
                    .anySatisfy(m -> assertThat(m)
                            .contains("twopc sink 'logged-sink' subtask 0")
                            .contains("started"));
        }
    }

    @Test
    public void targetsBecomeTwopcLoggerNames() {
        assertThat(NativeLog.loggerName("twopc_core::sink")).isEqualTo("twopc.core.sink");
        assertThat(NativeLog.loggerName("twopc_jni")).isEqualTo("twopc.jni");
        assertThat(NativeLog.loggerName("twopc::jni")).isEqualTo("twopc.jni");
        assertThat(NativeLog.loggerName("twopc")).isEqualTo("twopc");
        assertThat(NativeLog.loggerName("fail")).isEqualTo("twopc.fail");
        assertThat(NativeLog.loggerName("")).isEqualTo("twopc");
    }

    @Test
    public void theMaxLevelFollowsTheTwopcLogger() {
        // log4j2-test.properties sets the root logger to INFO.
        assertThat(NativeLog.maxLevel()).isEqualTo(3);
    }

    @Test
    public void aBrokenRecordNeverThrows() {
        NativeLog.log(99, null, null);
        NativeLog.log(1, "twopc::test", "an error record from a test");
    }
}
