package io.twopc.flink.it;

/** {@link TwopcSinkStartupChecksITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionStartupChecksITCase extends TwopcSinkStartupChecksITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
