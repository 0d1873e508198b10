package io.twopc.flink.internal;

import org.apache.flink.annotation.Internal;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Locale;

/**
 * Loads the twopc JNI library ({@code libtwopc_jni}) for the class loader of
 * {@link NativeBridge}.
 *
 * <p>The library ships inside the jar under {@code native/<os>-<arch>/}. It is
 * copied to a new, uniquely named temporary file and loaded from there, once
 * per class loader. A fixed path would not do: the JVM refuses to load one
 * library file into two class loaders, and Flink gives every job (and every
 * restart of a job submitted with its jar) a new class loader. Each class
 * loader therefore gets its own copy of the library, with its own registry of
 * sinks.
 *
 * <p>System property {@value #LIBRARY_PROPERTY} names a library file to use
 * instead of the one in the jar (a development build, or a platform the jar
 * does not carry); it is copied the same way. {@value #TMPDIR_PROPERTY}
 * chooses the directory for the copies (default {@code java.io.tmpdir}), for
 * hosts whose temporary directory is mounted {@code noexec}.
 */
@Internal
public final class NativeLoader {
    /** Overrides the library in the jar with this file. */
    public static final String LIBRARY_PROPERTY = "twopc.native.library";
    /** Directory for the extracted copy. */
    public static final String TMPDIR_PROPERTY = "twopc.native.tmpdir";

    static final String LIBRARY_NAME = "twopc_jni";
    /** Platforms the jar carries a library for (see build.gradle). */
    static final List<String> SUPPORTED = Collections.unmodifiableList(Arrays.asList("linux-x86_64"));

    /** Per class loader: this class is loaded once by each of them. */
    private static boolean loaded;
    /**
     * The first permanent failure (see {@link #isPermanent}), kept: a later attempt in the same
     * class loader (a Flink restart of the job) gets the same message, never a bare "could not
     * initialize class". A failed extraction is not kept: the next attempt tries again.
     */
    private static UnsatisfiedLinkError failure;

    private NativeLoader() {}

    /**
     * Loads the library for {@code owner}, the class declaring the native
     * methods, unless this class loader has loaded it already.
     *
     * <p>{@code System.load} binds a library to the class loader of its
     * caller, which is this class; the natives of {@code owner} resolve only
     * if it has the same loader, so anything else is refused.
     *
     * @throws UnsatisfiedLinkError if there is no library for this platform or
     *     it cannot be loaded; the message says which platform and what to do
     */
    public static synchronized void load(Class<?> owner) {
        if (owner.getClassLoader() != NativeLoader.class.getClassLoader()) {
            throw new IllegalArgumentException(
                    "twopc: " + owner.getName() + " is not in the class loader of " + NativeLoader.class.getName()
                            + "; its native methods would not find the library");
        }
        if (loaded) {
            return;
        }
        if (failure != null) {
            UnsatisfiedLinkError again = new UnsatisfiedLinkError(failure.getMessage());
            again.initCause(failure);
            throw again;
        }
        try {
            loadOnce(owner);
        } catch (UnsatisfiedLinkError e) {
            if (isPermanent(e)) {
                failure = e;
            }
            throw e;
        }
    }

    /**
     * True when the failure is one a restart cannot cure: no library for this platform, or a
     * library this system cannot load. An extraction that failed (a full temporary directory) may
     * work next time.
     */
    public static boolean isPermanent(UnsatisfiedLinkError e) {
        String m = String.valueOf(e.getMessage());
        return !m.startsWith("twopc: could not extract");
    }

    private static void loadOnce(Class<?> owner) {
        String override = System.getProperty(LIBRARY_PROPERTY);
        Path copy;
        String source;
        if (override != null && !override.trim().isEmpty()) {
            Path file = Paths.get(override.trim()).toAbsolutePath();
            source = file.toString();
            if (!Files.isRegularFile(file)) {
                throw new UnsatisfiedLinkError(
                        "twopc: -D" + LIBRARY_PROPERTY + "=" + override + " does not name a readable file");
            }
            copy = extract(source, () -> Files.newInputStream(file));
        } else {
            String platform = platform(System.getProperty("os.name"), System.getProperty("os.arch"));
            String resource = "native/" + platform + "/" + System.mapLibraryName(LIBRARY_NAME);
            ClassLoader loader = owner.getClassLoader() != null ? owner.getClassLoader() : ClassLoader.getSystemClassLoader();
            if (loader.getResource(resource) == null) {
                throw new UnsatisfiedLinkError(unsupported(
                        platform, System.getProperty("os.name"), System.getProperty("os.arch"),
                        "this jar has no " + resource));
            }
            source = resource;
            copy = extract(source, () -> loader.getResourceAsStream(resource));
        }
        try {
            System.load(copy.toString());
        } catch (UnsatisfiedLinkError e) {
            UnsatisfiedLinkError wrapped = new UnsatisfiedLinkError(
                    "twopc: could not load the native library (from " + source + ", copied to " + copy
                            + "): " + e.getMessage() + ". If the temporary directory is mounted noexec, set -D"
                            + TMPDIR_PROPERTY + " to another directory");
            wrapped.initCause(e);
            throw wrapped;
        } catch (LinkageError | RuntimeException e) {
            // What the library's JNI_OnLoad left pending (the logging set-up calling into SLF4J,
            // say) comes out of System.load as is. Callers map only UnsatisfiedLinkError to a
            // configuration error; anything else would break NativeBridge's initialisation for
            // good ("Could not initialize class") instead of saying why.
            UnsatisfiedLinkError wrapped = new UnsatisfiedLinkError(
                    "twopc: the native library (from " + source + ", copied to " + copy
                            + ") failed while initialising: " + e);
            wrapped.initCause(e);
            throw wrapped;
        } finally {
            // Once mapped, the file is no longer needed (the mapping stays
            // valid on Linux and macOS): removing it now keeps job restarts in
            // a long-lived TaskManager from piling up copies until JVM exit.
            // On Windows the delete fails while loaded: only then is the copy
            // left to deleteOnExit (each registration stays in the JVM's list
            // for good, one more per job restart if made every time).
            try {
                Files.deleteIfExists(copy);
            } catch (IOException | SecurityException e) {
                copy.toFile().deleteOnExit();
            }
        }
        loaded = true;
    }

    private interface Opener {
        InputStream open() throws IOException;
    }

    private static Path extract(String source, Opener opener) {
        try {
            String dir = System.getProperty(TMPDIR_PROPERTY);
            String suffix = suffixOf(System.mapLibraryName(LIBRARY_NAME));
            Path copy = dir == null || dir.trim().isEmpty()
                    ? Files.createTempFile("twopc-jni-", suffix)
                    : Files.createTempFile(Paths.get(dir.trim()), "twopc-jni-", suffix);
            try (InputStream in = opener.open()) {
                if (in == null) {
                    throw new IOException(source + " cannot be read");
                }
                Files.copy(in, copy, StandardCopyOption.REPLACE_EXISTING);
            } catch (Throwable e) {
                // Whatever stopped the copy (an Error too), the partial file goes, and the first
                // failure is the one reported.
                try {
                    Files.deleteIfExists(copy);
                } catch (IOException | RuntimeException cleanup) {
                    e.addSuppressed(cleanup);
                    copy.toFile().deleteOnExit();
                }
                throw e;
            }
            return copy;
        } catch (IOException | RuntimeException e) {
            UnsatisfiedLinkError error =
                    new UnsatisfiedLinkError("twopc: could not extract the native library " + source + ": " + e);
            error.initCause(e);
            throw error;
        }
    }

    private static String suffixOf(String fileName) {
        int dot = fileName.lastIndexOf('.');
        return dot < 0 ? ".so" : fileName.substring(dot);
    }

    /**
     * The platform directory for an {@code os.name} / {@code os.arch} pair,
     * e.g. {@code linux-x86_64}. Throws for a platform the jar does not carry.
     */
    static String platform(String osName, String osArch) {
        String os = normaliseOs(osName);
        String arch = normaliseArch(osArch);
        String platform = os + "-" + arch;
        if (!SUPPORTED.contains(platform)) {
            throw new UnsatisfiedLinkError(unsupported(platform, osName, osArch, "not a supported platform"));
        }
        return platform;
    }

    static String normaliseOs(String osName) {
        String os = osName == null ? "" : osName.toLowerCase(Locale.ROOT);
        if (os.startsWith("linux")) {
            return "linux";
        }
        if (os.startsWith("mac") || os.startsWith("darwin")) {
            return "macos";
        }
        if (os.startsWith("windows")) {
            return "windows";
        }
        return os.replaceAll("[^a-z0-9]+", "");
    }

    static String normaliseArch(String osArch) {
        String arch = osArch == null ? "" : osArch.toLowerCase(Locale.ROOT);
        switch (arch) {
            case "amd64":
            case "x86_64":
            case "x86-64":
            case "x64":
                return "x86_64";
            case "aarch64":
            case "arm64":
                return "aarch64";
            default:
                return arch.replaceAll("[^a-z0-9_]+", "");
        }
    }

    private static String unsupported(String platform, String osName, String osArch, String detail) {
        return "twopc: no native library for os.name=" + osName + ", os.arch=" + osArch + " (" + platform + "): "
                + detail + ". Supported: " + SUPPORTED + ". Build libtwopc_jni for this platform with cargo and"
                + " point -D" + LIBRARY_PROPERTY + " at it";
    }
}
