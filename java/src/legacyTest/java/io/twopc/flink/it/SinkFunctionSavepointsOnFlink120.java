package io.twopc.flink.it;

import org.apache.flink.client.program.ClusterClient;
import org.apache.flink.runtime.testutils.InMemoryReporter;
import org.apache.flink.runtime.util.EnvironmentInformation;
import org.apache.flink.test.util.MiniClusterWithClientResource;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

import static io.twopc.flink.it.TwopcItSupport.cluster;
import static io.twopc.flink.it.TwopcSinkLineUpgradeITCase.job;
import static io.twopc.flink.it.TwopcSinkLineUpgradeITCase.savepointWithPreparedTransactions;

/**
 * The Flink 1.20 half of {@code TwopcSinkLineUpgradeITCase}'s SinkFunction paths, run by that test
 * (on Flink 2.x) in a JVM of its own on the shim's test classpath. Arguments: the output
 * directory, the savepoint directory, the file to write the savepoints' paths into (one per line),
 * and optionally {@code one-step}.
 *
 * <p>It runs the SinkFunction and takes a savepoint with prepared transactions; unless told
 * {@code one-step}, it then restores that savepoint into the Sink V2 sink under the same uid (on
 * 1.20) and takes that job's savepoint with prepared transactions too.
 */
public final class SinkFunctionSavepointsOnFlink120 {
    private SinkFunctionSavepointsOnFlink120() {}

    public static void main(String[] args) throws Exception {
        Path output = Paths.get(args[0]);
        Path savepoints = Paths.get(args[1]);
        Path result = Paths.get(args[2]);
        boolean oneStep = args.length > 3 && args[3].equals("one-step");
        if (!EnvironmentInformation.getVersion().startsWith("1.20")) {
            throw new IllegalStateException("the savepoint half must run on Flink 1.20, not "
                    + EnvironmentInformation.getVersion());
        }
        InMemoryReporter metrics = InMemoryReporter.create();
        MiniClusterWithClientResource cluster = cluster(metrics, 2);
        cluster.before();
        try {
            ClusterClient<?> client = cluster.getClusterClient();
            List<String> taken = new ArrayList<>();
            taken.add(savepointWithPreparedTransactions(client, metrics,
                    job(SinkFunctionFrontEnd.SINK_FUNCTION, 2, output, 0, 3_600_000, 1), null, output, savepoints));
            if (!oneStep) {
                taken.add(savepointWithPreparedTransactions(client, metrics,
                        job(FrontEnd.SINK_V2, 2, output, 0, 3_600_000, 1), taken.get(0), output, savepoints));
            }
            Files.write(result, taken, StandardCharsets.UTF_8);
            System.out.println("savepoints on Flink " + EnvironmentInformation.getVersion() + ": " + taken);
        } finally {
            cluster.after();
        }
        System.exit(0);
    }
}
