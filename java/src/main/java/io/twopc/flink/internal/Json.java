package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;

import java.util.List;

/**
 * Writes the small JSON documents that cross to the native side (the sink configuration). A
 * dependency-free writer: the jar must not bring a JSON library onto every job's class path, and
 * Flink's shaded one is not an API.
 */
@Internal
public final class Json {
    private final StringBuilder out = new StringBuilder();
    private boolean first = true;

    private Json() {}

    /** Starts an object: {@code {}. */
    public static Json object() {
        Json j = new Json();
        j.out.append('{');
        return j;
    }

    private Json key(String key) {
        if (!first) {
            out.append(',');
        }
        first = false;
        string(out, key);
        out.append(':');
        return this;
    }

    public Json put(String key, String value) {
        key(key);
        if (value == null) {
            out.append("null");
        } else {
            string(out, value);
        }
        return this;
    }

    public Json put(String key, long value) {
        key(key).out.append(value);
        return this;
    }

    public Json put(String key, boolean value) {
        key(key).out.append(value);
        return this;
    }

    public Json put(String key, List<String> values) {
        key(key).out.append('[');
        for (int i = 0; i < values.size(); i++) {
            if (i > 0) {
                out.append(',');
            }
            string(out, values.get(i));
        }
        out.append(']');
        return this;
    }

    /** A nested object, written whole. */
    public Json put(String key, Json object) {
        key(key).out.append(object.end());
        return this;
    }

    /** The object's text, closed. */
    public String end() {
        return out.toString() + '}';
    }

    private static void string(StringBuilder out, String s) {
        out.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    out.append("\\\"");
                    break;
                case '\\':
                    out.append("\\\\");
                    break;
                case '\n':
                    out.append("\\n");
                    break;
                case '\r':
                    out.append("\\r");
                    break;
                case '\t':
                    out.append("\\t");
                    break;
                default:
                    if (c < 0x20) {
                        out.append(String.format("\\u%04x", (int) c));
                    } else {
                        out.append(c);
                    }
            }
        }
        out.append('"');
    }
}
