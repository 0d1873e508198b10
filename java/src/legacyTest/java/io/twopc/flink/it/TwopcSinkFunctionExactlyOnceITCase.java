package io.twopc.flink.it;

/** {@link TwopcSinkExactlyOnceITCase} through the SinkFunction shim ({@code addSink}) on Flink 1.20. */
public class TwopcSinkFunctionExactlyOnceITCase extends TwopcSinkExactlyOnceITCase {
    @Override
    protected FrontEnd frontEnd() {
        return SinkFunctionFrontEnd.SINK_FUNCTION;
    }
}
