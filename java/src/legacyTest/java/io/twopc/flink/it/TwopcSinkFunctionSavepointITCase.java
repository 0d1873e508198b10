package io.twopc.flink.it;

/** {@link TwopcSinkSavepointITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionSavepointITCase extends TwopcSinkSavepointITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
