package io.twopc.flink;

import org.apache.flink.annotation.PublicEvolving;

import java.io.Serializable;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

/**
 * Where a {@link TwopcSink} writes when the destination is an S3-compatible object store: {@code
 * s3://bucket/prefix}, where a directory path goes otherwise. Pass it to {@link
 * TwopcSinkBuilderBase#forObjectStore(ObjectStoreDestination)}, or give the URL to {@code
 * forDirectory("s3://bucket/prefix")} for AWS with its defaults:
 *
 * <pre>{@code
 * TwopcSink<String> sink = TwopcSink.<String>forObjectStore(
 *                 ObjectStoreDestination.s3("s3://my-bucket/orders")
 *                         .region("eu-central-1")
 *                         .savepointRetention(Duration.ofDays(30)))
 *         .setSinkId("orders")
 *         .setSerializationSchema(new SimpleStringSchema())
 *         .build();
 * }</pre>
 *
 * <p>Each transaction is one multipart upload of its final object, completed only when its
 * checkpoint completes: until then nothing is visible, and the parts are durable. Credentials are
 * never part of this object: each task manager reads them from the standard AWS environment
 * ({@code AWS_ACCESS_KEY_ID}, {@code AWS_SECRET_ACCESS_KEY}, {@code AWS_SESSION_TOKEN}) and profile
 * chain ({@code AWS_PROFILE}, {@code ~/.aws/credentials}, {@code ~/.aws/config}), then instance or
 * container credentials. At start the sink reads the bucket's lifecycle rules and refuses one that
 * aborts incomplete uploads sooner than it needs (see {@link #savepointRetention(Duration)}).
 *
 * <p>Instances are immutable: every setter returns a changed copy.
 */
@PublicEvolving
public final class ObjectStoreDestination implements Serializable {
    private static final long serialVersionUID = 1L;

    /** S3's smallest part (every part but a transaction's last must be at least this). */
    public static final long MIN_PART_SIZE = 5L << 20;
    public static final long DEFAULT_PART_SIZE = 8L << 20;
    /** S3's largest part. */
    static final long MAX_PART_SIZE = 5L << 30;

    private String url;
    private String endpoint;
    private String region;
    private boolean pathStyleAccess;
    private boolean allowHttp;
    private String profile;
    private long partSize = DEFAULT_PART_SIZE;
    private Duration savepointRetention = Duration.ZERO;

    private ObjectStoreDestination() {}

    /** An S3 destination: {@code s3://bucket} or {@code s3://bucket/prefix/of/keys}. */
    public static ObjectStoreDestination s3(String url) {
        ObjectStoreDestination d = new ObjectStoreDestination();
        d.url = url == null ? null : url.trim();
        return d;
    }

    /** True for a URL this class takes ({@code s3://...}). */
    public static boolean isObjectStoreUrl(String location) {
        return location != null && location.trim().regionMatches(true, 0, "s3://", 0, 5);
    }

    /**
     * Another endpoint than AWS's: an S3-compatible store ({@code https://storage.example}) or a
     * local server ({@code http://127.0.0.1:9000}, with {@link #allowHttp(boolean)}).
     */
    public ObjectStoreDestination endpoint(String endpoint) {
        ObjectStoreDestination d = copy();
        d.endpoint = endpoint;
        return d;
    }

    /** The region (default {@code us-east-1}). */
    public ObjectStoreDestination region(String region) {
        ObjectStoreDestination d = copy();
        d.region = region;
        return d;
    }

    /**
     * Path-style requests ({@code endpoint/bucket/key}) instead of virtual-hosted ones ({@code
     * bucket.endpoint/key}); most S3-compatible and local servers need them.
     */
    public ObjectStoreDestination pathStyleAccess(boolean pathStyle) {
        ObjectStoreDestination d = copy();
        d.pathStyleAccess = pathStyle;
        return d;
    }

    /** Permits a plain {@code http://} endpoint: for a local test server only. */
    public ObjectStoreDestination allowHttp(boolean allow) {
        ObjectStoreDestination d = copy();
        d.allowHttp = allow;
        return d;
    }

    /** The AWS profile each task manager reads when its environment has no keys. */
    public ObjectStoreDestination profile(String profile) {
        ObjectStoreDestination d = copy();
        d.profile = profile;
        return d;
    }

    /**
     * Bytes per uploaded part (default 8 MiB, at least 5 MiB, S3's minimum). Each open transaction
     * buffers about one part in native memory.
     */
    public ObjectStoreDestination partSize(long bytes) {
        ObjectStoreDestination d = copy();
        d.partSize = bytes;
        return d;
    }

    /**
     * How long you keep savepoints you may restore (default 0). A savepoint's transactions stay
     * prepared, as incomplete uploads, until a job resumes from it; a bucket lifecycle rule that
     * aborts incomplete uploads sooner would make it unrestorable, so the sink refuses such a rule
     * at start (it needs two checkpoint intervals, the restart allowance and this).
     */
    public ObjectStoreDestination savepointRetention(Duration retention) {
        ObjectStoreDestination d = copy();
        d.savepointRetention = retention;
        return d;
    }

    public String url() {
        return url;
    }

    String endpoint() {
        return endpoint;
    }

    String region() {
        return region;
    }

    boolean pathStyle() {
        return pathStyleAccess;
    }

    boolean httpAllowed() {
        return allowHttp;
    }

    String profileName() {
        return profile;
    }

    long partSizeBytes() {
        return partSize;
    }

    long savepointRetentionMs() {
        return savepointRetention.toMillis();
    }

    /** What is wrong with these settings, each with what to change (the native side checks more). */
    List<String> problems() {
        List<String> problems = new ArrayList<>();
        if (url == null || url.isEmpty()) {
            problems.add("the object store URL is not set; give s3://bucket/prefix");
        } else if (!isObjectStoreUrl(url)) {
            problems.add("the object store URL \"" + url + "\" must start with s3://, e.g. s3://my-bucket/output");
        }
        if (partSize < MIN_PART_SIZE || partSize > MAX_PART_SIZE) {
            problems.add("part size " + partSize + " bytes must be between 5 MiB (" + MIN_PART_SIZE
                    + ", S3's smallest part) and 5 GiB; partSize(" + DEFAULT_PART_SIZE + ") is the default");
        }
        if (savepointRetention == null || savepointRetention.isNegative()) {
            problems.add("savepoint retention must be zero or more, e.g. Duration.ofDays(30)");
        } else if (savepointRetention.getSeconds() > Long.MAX_VALUE / 1000 - 1) {
            problems.add("savepoint retention " + savepointRetention + " is too large to count in milliseconds");
        }
        if (endpoint != null && endpoint.startsWith("http://") && !allowHttp) {
            problems.add("the endpoint " + endpoint + " is plain http; use https, or allowHttp(true) for a "
                    + "local test server");
        }
        return problems;
    }

    private ObjectStoreDestination copy() {
        ObjectStoreDestination d = new ObjectStoreDestination();
        d.url = url;
        d.endpoint = endpoint;
        d.region = region;
        d.pathStyleAccess = pathStyleAccess;
        d.allowHttp = allowHttp;
        d.profile = profile;
        d.partSize = partSize;
        d.savepointRetention = savepointRetention;
        return d;
    }

    @Override
    public String toString() {
        return url + (endpoint != null ? " at " + endpoint : "")
                + (region != null ? " (" + region + ")" : "")
                + ", parts of " + partSize + " bytes";
    }
}
