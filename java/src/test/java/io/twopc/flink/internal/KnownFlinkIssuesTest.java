package io.twopc.flink.internal;

import org.junit.Test;

import static org.assertj.core.api.Assertions.assertThat;

/** The releases whose Sink V2 committer commits after the end of input early (bytecode-checked). */
public class KnownFlinkIssuesTest {
    /**
     * Releases before 1.20 are not judged (the sink does not run on them); a version that is not
     * three short numbers, such as a vendor's build number, is never an exception.
     */
    @Test
    public void onlyTheAffectedReleasesAreNamed() {
        for (String affected : new String[] {"1.20.0", "1.20.1", "2.0.0", "2.0.0-rc1"}) {
            assertThat(KnownFlinkIssues.commitsAfterEndOfInputEarly(affected)).as(affected).isTrue();
        }
        for (String fixed : new String[] {"1.20.2", "1.20.3", "1.20.5", "2.0.1", "2.1.0", "2.3.0",
                "<unknown>", "", null, "1.20.99999999999", "99999999999.0.0"}) {
            assertThat(KnownFlinkIssues.commitsAfterEndOfInputEarly(fixed)).as(fixed).isFalse();
        }
    }
}
