package io.twopc.flink.bench;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UnsupportedEncodingException;
import java.net.HttpURLConnection;
import java.net.URL;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The benchmark's own view of the local S3 server ({@code scripts/s3.sh}, moto): the plain REST
 * API over HTTP, path style, unsigned (moto accepts unsigned requests). Deliberately not the
 * client of either sink under test: the bucket is read back as any reader of it would read it,
 * so a sink's client cannot vouch for its own output.
 */
final class BenchS3 {
    /** A key of a listing, with its size in bytes. */
    static final class ObjectInfo {
        final String key;
        final long size;

        ObjectInfo(String key, long size) {
            this.key = key;
            this.size = size;
        }
    }

    /** An incomplete multipart upload. */
    static final class Upload {
        final String key;
        final String uploadId;

        Upload(String key, String uploadId) {
            this.key = key;
            this.uploadId = uploadId;
        }
    }

    private static final Pattern CONTENTS = Pattern.compile("<Contents>(.*?)</Contents>", Pattern.DOTALL);
    private static final Pattern UPLOAD = Pattern.compile("<Upload>(.*?)</Upload>", Pattern.DOTALL);

    final String endpoint;

    BenchS3(String endpoint) {
        if (endpoint == null || endpoint.isEmpty()) {
            throw new IllegalArgumentException("--s3-endpoint=http://127.0.0.1:PORT is required for the object-store "
                    + "cases; scripts/bench.sh starts the local server and passes it (or start one with "
                    + "eval \"$(TWOPC_S3_PORT=54372 bash scripts/s3.sh start)\" and pass $TWOPC_S3_ENDPOINT)");
        }
        this.endpoint = endpoint.endsWith("/") ? endpoint.substring(0, endpoint.length() - 1) : endpoint;
    }

    /**
     * Creates {@code bucket}. An existing bucket is an error: a leftover of an interrupted run would
     * hold another run's objects, and the verification counts every object.
     */
    void createBucket(String bucket) throws IOException {
        List<ObjectInfo> existing;
        try {
            existing = list(bucket, "");
        } catch (IOException e) {
            existing = null; // NoSuchBucket: the normal case
        }
        if (existing != null) {
            throw new IOException("bucket " + bucket + " already exists on " + endpoint + " with " + existing.size()
                    + " objects; restart the bench's S3 server (bash scripts/s3.sh stop with its TWOPC_S3_PORT)");
        }
        request("PUT", "/" + bucket, 200);
    }

    /** Every object under {@code prefix}, in key order (ListObjectsV2, all pages). */
    List<ObjectInfo> list(String bucket, String prefix) throws IOException {
        List<ObjectInfo> out = new ArrayList<>();
        String token = null;
        do {
            String query = "?list-type=2&max-keys=1000&prefix=" + enc(prefix)
                    + (token == null ? "" : "&continuation-token=" + enc(token));
            String xml = text(request("GET", "/" + bucket + query, 200));
            Matcher m = CONTENTS.matcher(xml);
            while (m.find()) {
                String entry = m.group(1);
                out.add(new ObjectInfo(unescape(tag(entry, "Key")), Long.parseLong(tag(entry, "Size"))));
            }
            token = xml.contains("<IsTruncated>true</IsTruncated>") ? tag(xml, "NextContinuationToken") : null;
        } while (token != null);
        return out;
    }

    /** Incomplete multipart uploads under {@code prefix}. */
    List<Upload> uploads(String bucket, String prefix) throws IOException {
        String xml = text(request("GET", "/" + bucket + "?uploads&prefix=" + enc(prefix), 200));
        List<Upload> out = new ArrayList<>();
        Matcher m = UPLOAD.matcher(xml);
        while (m.find()) {
            out.add(new Upload(unescape(tag(m.group(1), "Key")), unescape(tag(m.group(1), "UploadId"))));
        }
        return out;
    }

    /** Opens an object's bytes; the caller closes the stream. */
    InputStream open(String bucket, String key) throws IOException {
        HttpURLConnection c = connect("GET", "/" + bucket + "/" + path(key));
        int status = c.getResponseCode();
        if (status != 200) {
            throw failure(c, "GET", key, status);
        }
        return c.getInputStream();
    }

    /**
     * Empties and removes the bucket, so that the in-memory server does not carry one run's data
     * into the next runs (it holds everything in its own heap). Objects go through DeleteObjects,
     * a request on the bucket: moto refuses an unsigned DeleteObject of an object written by
     * PutObject (it carries the default private ACL), which twopc's control objects are.
     */
    void deleteBucket(String bucket) throws IOException {
        for (Upload u : uploads(bucket, "")) {
            request("DELETE", "/" + bucket + "/" + path(u.key) + "?uploadId=" + enc(u.uploadId), 204);
        }
        List<ObjectInfo> objects = list(bucket, "");
        for (int from = 0; from < objects.size(); from += 1000) {
            StringBuilder xml = new StringBuilder("<Delete><Quiet>true</Quiet>");
            for (ObjectInfo o : objects.subList(from, Math.min(objects.size(), from + 1000))) {
                xml.append("<Object><Key>").append(escape(o.key)).append("</Key></Object>");
            }
            xml.append("</Delete>");
            String answer = text(post("/" + bucket + "?delete", xml.toString().getBytes(StandardCharsets.UTF_8)));
            if (answer.contains("<Error>")) {
                throw new IOException("DeleteObjects in " + bucket + " failed for some keys: "
                        + (answer.length() > 500 ? answer.substring(0, 500) : answer));
            }
        }
        request("DELETE", "/" + bucket, 204);
    }

    // ------------------------------------------------------------------ HTTP

    private HttpURLConnection connect(String method, String pathAndQuery) throws IOException {
        HttpURLConnection c = (HttpURLConnection) new URL(endpoint + pathAndQuery).openConnection();
        c.setRequestMethod(method);
        c.setConnectTimeout(5_000);
        c.setReadTimeout(120_000);
        return c;
    }

    private byte[] request(String method, String pathAndQuery, int expected) throws IOException {
        HttpURLConnection c = connect(method, pathAndQuery);
        if (method.equals("PUT")) {
            c.setDoOutput(true);
            c.setFixedLengthStreamingMode(0);
            c.getOutputStream().close();
        }
        int status = c.getResponseCode();
        if (status != expected) {
            throw failure(c, method, pathAndQuery, status);
        }
        try (InputStream in = c.getInputStream()) {
            return readAll(in);
        }
    }

    /** A POST with a body and its Content-MD5, which S3 requires of DeleteObjects. */
    private byte[] post(String pathAndQuery, byte[] body) throws IOException {
        HttpURLConnection c = connect("POST", pathAndQuery);
        c.setDoOutput(true);
        c.setFixedLengthStreamingMode(body.length);
        c.setRequestProperty("Content-Type", "application/xml");
        try {
            c.setRequestProperty("Content-MD5",
                    Base64.getEncoder().encodeToString(MessageDigest.getInstance("MD5").digest(body)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("this JVM has no MD5, which every JVM must have", e);
        }
        try (OutputStream out = c.getOutputStream()) {
            out.write(body);
        }
        int status = c.getResponseCode();
        if (status != 200) {
            throw failure(c, "POST", pathAndQuery, status);
        }
        try (InputStream in = c.getInputStream()) {
            return readAll(in);
        }
    }

    private IOException failure(HttpURLConnection c, String method, String what, int status) throws IOException {
        String body = "";
        InputStream err = c.getErrorStream();
        if (err != null) {
            try (InputStream in = err) {
                body = text(readAll(in));
            }
        }
        String hint = status == 403 && body.isEmpty()
                ? " (moto refuses unsigned requests for objects written by PutObject, which carry a private "
                + "ACL; the benchmark reads only multipart-uploaded objects unsigned)"
                : "";
        return new IOException(method + " " + endpoint + " " + what + " answered HTTP " + status + ": "
                + (body.length() > 500 ? body.substring(0, 500) : body) + hint);
    }

    private static byte[] readAll(InputStream in) throws IOException {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        byte[] chunk = new byte[1 << 16];
        for (int n; (n = in.read(chunk)) > 0; ) {
            buf.write(chunk, 0, n);
        }
        return buf.toByteArray();
    }

    private static String text(byte[] bytes) {
        return new String(bytes, StandardCharsets.UTF_8);
    }

    private static String tag(String xml, String name) {
        int start = xml.indexOf("<" + name + ">");
        int end = xml.indexOf("</" + name + ">");
        if (start < 0 || end < start) {
            return null;
        }
        return xml.substring(start + name.length() + 2, end);
    }

    private static String escape(String s) {
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;");
    }

    private static String unescape(String s) {
        return s == null ? null : s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"")
                .replace("&apos;", "'").replace("&amp;", "&");
    }

    private static String enc(String s) throws UnsupportedEncodingException {
        return URLEncoder.encode(s, "UTF-8");
    }

    /** A key as a URL path: each segment encoded, the slashes kept. */
    private static String path(String key) throws UnsupportedEncodingException {
        StringBuilder sb = new StringBuilder();
        String[] segments = key.split("/", -1);
        for (int i = 0; i < segments.length; i++) {
            sb.append(i == 0 ? "" : "/").append(URLEncoder.encode(segments[i], "UTF-8").replace("+", "%20"));
        }
        return sb.toString();
    }
}
