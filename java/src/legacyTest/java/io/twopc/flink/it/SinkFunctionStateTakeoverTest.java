package io.twopc.flink.it;

import io.twopc.flink.TwopcTransaction;
import io.twopc.flink.TwopcTransactionSerializer;
import io.twopc.flink.internal.SinkFunctionStateSerializer;

import org.apache.flink.api.common.ExecutionConfig;
import org.apache.flink.api.common.state.ListState;
import org.apache.flink.api.common.state.ListStateDescriptor;
import org.apache.flink.api.common.typeutils.TypeSerializer;
import org.apache.flink.api.common.typeutils.base.VoidSerializer;
import org.apache.flink.core.fs.CloseableRegistry;
import org.apache.flink.runtime.checkpoint.CheckpointOptions;
import org.apache.flink.runtime.state.DefaultOperatorStateBackend;
import org.apache.flink.runtime.state.DefaultOperatorStateBackendBuilder;
import org.apache.flink.runtime.state.OperatorStateHandle;
import org.apache.flink.runtime.state.SnapshotResult;
import org.apache.flink.runtime.state.memory.MemCheckpointStreamFactory;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.State;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.StateSerializer;
import org.apache.flink.streaming.api.functions.sink.TwoPhaseCommitSinkFunction.TransactionHolder;

import org.junit.Test;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.RunnableFuture;

import static org.assertj.core.api.Assertions.assertThat;

/**
 * The state of Flink's {@code TwoPhaseCommitSinkFunction} through Flink 1.20's operator state
 * backend, snapshot by snapshot, as the upgrade path takes it: written by an earlier release under
 * Flink's own serializer; taken over by this release's SinkFunction under {@link
 * SinkFunctionStateSerializer}; carried by a Sink V2 job that never reads it; and still decodable
 * by the SinkFunction at the end.
 */
@SuppressWarnings({"deprecation", "unchecked", "rawtypes"})
public class SinkFunctionStateTakeoverTest {
    private static final TypeSerializer<Object> FLINK_FORMAT =
            (TypeSerializer) new StateSerializer<>(TwopcTransactionSerializer.INSTANCE, VoidSerializer.INSTANCE);

    private static List<Object> sampleStates() {
        List<Object> states = new ArrayList<>();
        for (int subtask = 0; subtask < 3; subtask++) {
            TwopcTransaction open = new TwopcTransaction(new byte[] {1, 2, (byte) subtask});
            TwopcTransaction prepared = new TwopcTransaction(new byte[] {9, 8, 7, (byte) subtask});
            states.add(new State<>(new TransactionHolder<>(open, 1000 + subtask),
                    Collections.singletonList(new TransactionHolder<>(prepared, 500 + subtask)), Optional.empty()));
        }
        return states;
    }

    private static DefaultOperatorStateBackend backend(OperatorStateHandle restoreFrom) throws Exception {
        Collection<OperatorStateHandle> handles =
                restoreFrom == null ? Collections.emptyList() : Collections.singletonList(restoreFrom);
        return new DefaultOperatorStateBackendBuilder(SinkFunctionStateTakeoverTest.class.getClassLoader(),
                new ExecutionConfig(), false, handles, new CloseableRegistry()).build();
    }

    private static OperatorStateHandle snapshot(DefaultOperatorStateBackend backend, long checkpointId)
            throws Exception {
        RunnableFuture<SnapshotResult<OperatorStateHandle>> snapshot = backend.snapshot(checkpointId, checkpointId,
                new MemCheckpointStreamFactory(1 << 20), CheckpointOptions.forCheckpointWithDefaultLocation());
        snapshot.run();
        return snapshot.get().getJobManagerOwnedSnapshot();
    }

    /** What the SinkFunction of this release does in initializeState, before the base class reads. */
    private static List<Object> registerAsTheSinkFunction(DefaultOperatorStateBackend backend) throws Exception {
        ListState<Object> state = backend.getListState(new ListStateDescriptor<>(
                SinkFunctionStateSerializer.STATE_NAME, new SinkFunctionStateSerializer(FLINK_FORMAT)));
        List<Object> decoded = new ArrayList<>();
        for (Object element : state.get()) {
            decoded.add(SinkFunctionStateSerializer.decode(element, FLINK_FORMAT));
        }
        state.update(decoded);
        // The base class registers its own descriptor next, and must get the same state.
        ListState<Object> baseClass = backend.getListState(
                new ListStateDescriptor<>(SinkFunctionStateSerializer.STATE_NAME, FLINK_FORMAT));
        assertThat(baseClass).isSameAs(state);
        return decoded;
    }

    @Test
    public void theStateOfAnEarlierReleaseIsTakenOverCarriedAndReadBack() throws Exception {
        List<Object> states = sampleStates();

        // An earlier release: Flink's own serializer.
        DefaultOperatorStateBackend earlier = backend(null);
        earlier.getListState(new ListStateDescriptor<>(SinkFunctionStateSerializer.STATE_NAME, FLINK_FORMAT))
                .update(states);
        OperatorStateHandle earlierSnapshot = snapshot(earlier, 1);

        // This release's SinkFunction takes it over and snapshots it under its own serializer.
        DefaultOperatorStateBackend takeover = backend(earlierSnapshot);
        assertThat(registerAsTheSinkFunction(takeover)).isEqualTo(states);
        OperatorStateHandle takenOver = snapshot(takeover, 2);

        // A Sink V2 job never registers the state: Flink restores and snapshots it as it is,
        // under the serializer the snapshot names.
        DefaultOperatorStateBackend sinkV2 = backend(takenOver);
        assertThat(sinkV2.getRegisteredStateNames()).contains(SinkFunctionStateSerializer.STATE_NAME);
        OperatorStateHandle carried = snapshot(sinkV2, 3);

        // Its elements are still the SinkFunction's state.
        DefaultOperatorStateBackend again = backend(carried);
        assertThat(registerAsTheSinkFunction(again)).isEqualTo(states);
    }

    @Test
    public void aSnapshotUnderTwopcsSerializerIsNotReadAsFlinksOwn() throws Exception {
        DefaultOperatorStateBackend sinkFunction = backend(null);
        registerAsTheSinkFunction(sinkFunction);
        sinkFunction.getListState(new ListStateDescriptor<>(SinkFunctionStateSerializer.STATE_NAME, FLINK_FORMAT))
                .update(sampleStates());
        OperatorStateHandle written = snapshot(sinkFunction, 1);

        // Flink's serializer cannot read the framing; Flink must refuse, not misread.
        DefaultOperatorStateBackend restored = backend(written);
        Throwable refused = null;
        try {
            restored.getListState(new ListStateDescriptor<>(SinkFunctionStateSerializer.STATE_NAME, FLINK_FORMAT));
        } catch (Exception e) {
            refused = e;
        }
        assertThat(refused).as("Flink's own serializer registered over twopc's").isNotNull();
        assertThat(Arrays.asList(refused.getClass().getSimpleName(), String.valueOf(refused.getMessage())).toString())
                .containsIgnoringCase("incompatible");
    }
}
