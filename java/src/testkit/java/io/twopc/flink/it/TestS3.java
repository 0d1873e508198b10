package io.twopc.flink.it;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.URL;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The local S3 server of the tests ({@code TWOPC_S3_ENDPOINT}, started by {@code eval "$(bash
 * scripts/s3.sh start)"}), reached through the plain S3 REST API, path style, without signatures
 * (the moto server accepts unsigned requests): what a reader of the bucket sees, independent of
 * the sink's own client.
 */
public final class TestS3 {
    public final String endpoint;

    private TestS3(String endpoint) {
        this.endpoint = endpoint.endsWith("/") ? endpoint.substring(0, endpoint.length() - 1) : endpoint;
    }

    /** The server the test command started; fails (never skips) without one. */
    public static TestS3 fromEnvironment() {
        String endpoint = System.getenv("TWOPC_S3_ENDPOINT");
        if (endpoint == null || endpoint.isEmpty()) {
            throw new IllegalStateException("TWOPC_S3_ENDPOINT is not set: the object-store tests need the local "
                    + "S3 server; start it with eval \"$(bash scripts/s3.sh start)\" and run the tests again");
        }
        return new TestS3(endpoint);
    }

    /** A new, empty bucket with a unique name. */
    public String newBucket(String prefix) throws IOException {
        String bucket = (prefix + "-" + UUID.randomUUID().toString().substring(0, 8)).toLowerCase();
        request("PUT", "/" + bucket, null, 200);
        return bucket;
    }

    /** Sets the bucket's lifecycle configuration (XML, as S3 takes it). */
    public void putLifecycle(String bucket, String xml) throws IOException {
        request("PUT", "/" + bucket + "?lifecycle", xml.getBytes(StandardCharsets.UTF_8), 200);
    }

    /** Every key under {@code prefix}. */
    public List<String> keys(String bucket, String prefix) throws IOException {
        List<String> keys = new ArrayList<>();
        String token = null;
        do {
            String query = "?list-type=2&prefix=" + enc(prefix) + (token == null ? "" : "&continuation-token=" + enc(token));
            String xml = new String(request("GET", "/" + bucket + query, null, 200), StandardCharsets.UTF_8);
            keys.addAll(all(xml, "<Key>(.*?)</Key>"));
            List<String> next = all(xml, "<NextContinuationToken>(.*?)</NextContinuationToken>");
            token = xml.contains("<IsTruncated>true</IsTruncated>") && !next.isEmpty() ? next.get(0) : null;
        } while (token != null);
        return keys;
    }

    /** The keys of multipart uploads not completed nor aborted under {@code prefix}. */
    public List<String> openUploads(String bucket, String prefix) throws IOException {
        String xml = new String(request("GET", "/" + bucket + "?uploads&prefix=" + enc(prefix), null, 200),
                StandardCharsets.UTF_8);
        return all(xml, "<Key>(.*?)</Key>");
    }

    public byte[] get(String bucket, String key) throws IOException {
        return request("GET", "/" + bucket + "/" + key, null, 200);
    }

    private byte[] request(String method, String path, byte[] body, int expected) throws IOException {
        HttpURLConnection c = (HttpURLConnection) new URL(endpoint + path).openConnection();
        c.setRequestMethod(method);
        c.setConnectTimeout(5_000);
        c.setReadTimeout(30_000);
        if (body != null) {
            c.setDoOutput(true);
            c.setFixedLengthStreamingMode(body.length);
            try (OutputStream out = c.getOutputStream()) {
                out.write(body);
            }
        }
        int status = c.getResponseCode();
        InputStream in = status >= 400 ? c.getErrorStream() : c.getInputStream();
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        if (in != null) {
            try (InputStream i = in) {
                byte[] chunk = new byte[1 << 16];
                for (int n; (n = i.read(chunk)) > 0; ) {
                    buf.write(chunk, 0, n);
                }
            }
        }
        if (status != expected) {
            throw new IOException(method + " " + path + " answered " + status + ": "
                    + new String(buf.toByteArray(), StandardCharsets.UTF_8));
        }
        return buf.toByteArray();
    }

    private static String enc(String s) throws IOException {
        return URLEncoder.encode(s, "UTF-8");
    }

    private static List<String> all(String text, String regex) {
        List<String> out = new ArrayList<>();
        Matcher m = Pattern.compile(regex).matcher(text);
        while (m.find()) {
            out.add(m.group(1).replace("&amp;", "&"));
        }
        return out;
    }
}
