package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** How serialized records are laid out in the committed output files. */
@PublicEvolving
public enum RecordFormat {
    /**
     * Each record followed by {@code \n}: what Flink's {@code TextLineInputFormat} and most line
     * readers expect. A record must then not contain {@code \n} itself (the sink rejects it, since
     * it would read back as two records).
     */
    LINES,
    /** Records written back to back exactly as the serialization schema produced them. */
    RAW
}
