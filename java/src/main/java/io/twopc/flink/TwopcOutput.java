package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * Reads what a {@link TwopcSink} has committed to a directory, the way a downstream reader
 * should: only visible {@code <prefix>-*} files, never anything under {@code _twopc/} (staging,
 * commit records) or other names starting with {@code _} or {@code .}, which Flink's and Hadoop's
 * file readers skip too.
 *
 * <p>Committed files appear by an atomic rename, so a file is either absent or complete: reading
 * while the job runs gives a consistent prefix of the output, per file.
 */
@PublicEvolving
public final class TwopcOutput {
    private TwopcOutput() {}

    /** The committed records of {@link RecordFormat#LINES} output with the default prefix {@code part}. */
    public static List<String> readCommittedRecords(Path directory) throws IOException {
        return readCommittedRecords(directory, "part");
    }

    /**
     * The committed records of {@link RecordFormat#LINES} output, file by file in name order, each
     * line decoded as UTF-8 without its terminating {@code \n}.
     */
    public static List<String> readCommittedRecords(Path directory, String partPrefix) throws IOException {
        List<String> records = new ArrayList<>();
        for (Path file : committedFiles(directory, partPrefix)) {
            String content = new String(Files.readAllBytes(file), StandardCharsets.UTF_8);
            int start = 0;
            int newline;
            while ((newline = content.indexOf('\n', start)) >= 0) {
                records.add(content.substring(start, newline));
                start = newline + 1;
            }
            if (start < content.length()) {
                // The sink terminates every record; an unterminated tail means the file was
                // changed by something else. Report it rather than guess.
                throw new IOException(file + " ends with " + (content.length() - start) + " characters "
                        + "after its last newline; it was not written (only) by a LINES-format twopc sink");
            }
        }
        return records;
    }

    /** The visible committed files, sorted by name. An absent directory has none. */
    public static List<Path> committedFiles(Path directory, String partPrefix) throws IOException {
        if (!Files.isDirectory(directory)) {
            return Collections.emptyList();
        }
        String namePrefix = partPrefix + "-";
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(directory)) {
            for (Path entry : entries) {
                String name = entry.getFileName().toString();
                if (name.startsWith("_") || name.startsWith(".") || !name.startsWith(namePrefix)) {
                    continue;
                }
                if (Files.isRegularFile(entry)) {
                    files.add(entry);
                }
            }
        }
        Collections.sort(files);
        return files;
    }
}
