package io.twopc.flink.it;

/** {@link TwopcSinkStateSizeITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionStateSizeITCase extends TwopcSinkStateSizeITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
