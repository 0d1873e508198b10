package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/**
 * How a {@link PostgresDestination} makes a repeated write harmless. The README compares the two
 * ("Transactional or idempotent").
 */
@PublicEvolving
public enum PostgresMode {
    /**
     * Each subtask COPYs a checkpoint's records into one transaction, prepares it ({@code PREPARE
     * TRANSACTION}) when the checkpoint is taken and commits it ({@code COMMIT PREPARED}) when the
     * checkpoint completes. Rows appear at checkpoint boundaries, exactly once. Needs {@code
     * max_prepared_transactions} of at least the sink's parallelism (better: twice it). The
     * default.
     */
    TRANSACTIONAL,
    /**
     * Upserts on the key columns ({@code INSERT ... ON CONFLICT DO UPDATE}), committed batch by
     * batch: rows appear at once, and a replay after a failure rewrites the same keys. Needs a
     * primary key or unique index on exactly the key columns. Readers may see values the job later
     * rewinds and replays.
     */
    IDEMPOTENT
}
