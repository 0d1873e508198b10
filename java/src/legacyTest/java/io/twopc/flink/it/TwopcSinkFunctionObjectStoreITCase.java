package io.twopc.flink.it;

/** {@link TwopcSinkObjectStoreITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionObjectStoreITCase extends TwopcSinkObjectStoreITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
