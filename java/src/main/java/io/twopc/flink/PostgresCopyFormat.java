package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

/** The row format of the records a {@link PostgresDestination} loads with {@code COPY}. */
@PublicEvolving
public enum PostgresCopyFormat {
    /**
     * CSV as PostgreSQL reads it by default: comma-separated, double quotes, an unquoted empty
     * field is NULL and {@code ""} the empty string. {@link CsvRowSchema} writes it. The default.
     */
    CSV,
    /**
     * PostgreSQL's COPY text format: tab-separated, {@code \N} is NULL, backslash escapes
     * ({@code \t}, {@code \n}, {@code \\}) inside values.
     */
    TEXT
}
