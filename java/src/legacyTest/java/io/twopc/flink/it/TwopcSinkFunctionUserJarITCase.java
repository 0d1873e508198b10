package io.twopc.flink.it;

/** {@link TwopcSinkUserJarITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionUserJarITCase extends TwopcSinkUserJarITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
