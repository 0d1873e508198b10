package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** How a directory sink writes staged data. */
@PublicEvolving
public enum IoMode {
    /** Direct I/O where the file system allows it, else through the page cache (the default). */
    AUTO,
    /** Direct I/O only: a file system that refuses it fails the first write, naming the directory. */
    DIRECT,
    /** Through the page cache, with background write-back. */
    BUFFERED
}
