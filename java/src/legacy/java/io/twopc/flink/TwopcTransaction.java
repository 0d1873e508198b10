package io.twopc.flink;

import org.apache.flink.annotation.Internal;

import java.util.Arrays;
import java.util.Objects;

/**
 * One transaction of a {@link TwopcSinkFunction} subtask, as Flink's {@code TwoPhaseCommitSinkFunction}
 * keeps it: the core's encoded transaction handle (a versioned envelope naming the sink,
 * transaction id, lineage, run and, once prepared, the checkpoint). These bytes are what {@link
 * TwopcTransactionSerializer} writes into Flink's checkpoint state, so a restarted job can name
 * the exact transaction it has to commit or abort.
 *
 * <p>Mutable on purpose: Flink keeps the same object from {@code beginTransaction} through {@code
 * preCommit} into its pending-commit map, and the prepared handle (which records the checkpoint
 * and the staged length) must replace the open one in that object.
 */
@Internal
public final class TwopcTransaction {
    private byte[] handle;
    /** For log lines only; filled by the sink from the handle, never serialized. */
    private transient String transactionId;

    public TwopcTransaction(byte[] handle) {
        this.handle = Objects.requireNonNull(handle, "handle");
    }

    /** The encoded handle. Callers must not modify the array. */
    public byte[] handle() {
        return handle;
    }

    /** Replaces the open handle with the prepared one returned by the core. */
    void replaceHandle(byte[] newHandle) {
        this.handle = Objects.requireNonNull(newHandle, "newHandle");
    }

    /** The transaction id, when the sink has decoded it (null otherwise). */
    public String transactionId() {
        return transactionId;
    }

    void setTransactionId(String transactionId) {
        this.transactionId = transactionId;
    }

    TwopcTransaction deepCopy() {
        TwopcTransaction copy = new TwopcTransaction(handle.clone());
        copy.transactionId = transactionId;
        return copy;
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof TwopcTransaction && Arrays.equals(handle, ((TwopcTransaction) o).handle);
    }

    @Override
    public int hashCode() {
        return Arrays.hashCode(handle);
    }

    @Override
    public String toString() {
        return transactionId != null
                ? "TwopcTransaction{" + transactionId + "}"
                : "TwopcTransaction{" + handle.length + " handle bytes}";
    }
}
