package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** When a directory sink's commit shows its output to readers. */
@PublicEvolving
public enum CommitOrder {
    /**
     * After the commit is durable: its decision and commit record are synced to the device first
     * (two to four flushes, a few milliseconds under write load). Output readers saw is never taken
     * back, whatever fails. The default.
     */
    DURABLE_FIRST,
    /**
     * At once: a hard link gives the staged data its visible name a fraction of a millisecond into
     * the commit, and the commit is made durable after. A process crash takes nothing back. A power
     * loss or kernel crash of the host within those milliseconds can: the output readers saw
     * disappears until the job's restore from its latest checkpoint commits it again (same name,
     * same content); and if the job is instead restored from an earlier checkpoint or savepoint
     * after such a power loss, twopc cannot know readers saw it, and the replay writes those
     * records again. Choose it where readers poll for new files and latency matters more than that
     * case. Falls back to {@link #DURABLE_FIRST} on a file system without hard links.
     */
    VISIBLE_FIRST
}
