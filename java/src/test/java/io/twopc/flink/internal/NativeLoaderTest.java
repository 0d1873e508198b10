package io.twopc.flink.internal;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import java.io.File;
import java.lang.ref.WeakReference;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class NativeLoaderTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    @Test
    public void architecturesAreNormalised() {
        assertThat(NativeLoader.normaliseArch("amd64")).isEqualTo("x86_64");
        assertThat(NativeLoader.normaliseArch("x86_64")).isEqualTo("x86_64");
        assertThat(NativeLoader.normaliseArch("AARCH64")).isEqualTo("aarch64");
        assertThat(NativeLoader.normaliseArch("arm64")).isEqualTo("aarch64");
        assertThat(NativeLoader.normaliseOs("Linux")).isEqualTo("linux");
        assertThat(NativeLoader.normaliseOs("Mac OS X")).isEqualTo("macos");
        assertThat(NativeLoader.platform("Linux", "amd64")).isEqualTo("linux-x86_64");
    }

    @Test
    public void anUnsupportedPlatformIsNamed() {
        assertThatThrownBy(() -> NativeLoader.platform("Mac OS X", "aarch64"))
                .isInstanceOf(UnsatisfiedLinkError.class)
                .hasMessageContaining("os.name=Mac OS X")
                .hasMessageContaining("os.arch=aarch64")
                .hasMessageContaining("linux-x86_64")
                .hasMessageContaining(NativeLoader.LIBRARY_PROPERTY);
        assertThatThrownBy(() -> NativeLoader.platform("Linux", "ppc64le"))
                .isInstanceOf(UnsatisfiedLinkError.class)
                .hasMessageContaining("os.arch=ppc64le");
    }

    @Test
    public void loadingTwiceIsANoOpAndOtherLoadersAreRefused() {
        NativeBridge.ensureLoaded();
        NativeLoader.load(NativeBridge.class);
        assertThatThrownBy(() -> NativeLoader.load(String.class)).isInstanceOf(IllegalArgumentException.class);
    }

    /**
     * What Flink does on every job restart: the same classes in a new
     * child-first class loader. Each loader gets its own copy of the library,
     * with its own sinks and its own exception classes.
     */
    @Test
    public void eachClassLoaderGetsItsOwnLibrary() throws Exception {
        NativeBridge.ensureLoaded();
        long parentSink = NativeTestSupport.open(tmp.newFolder("parent"), "parent");
        int deleteOnExit = deleteOnExitEntries();
        try {
            for (int attempt = 0; attempt < 3; attempt++) {
                try (ChildFirst loader = new ChildFirst()) {
                    Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
                    assertThat(bridge).isNotSameAs(NativeBridge.class);
                    long childSink = openIn(bridge, tmp.newFolder("child" + attempt), "child");
                    Method stats = bridge.getMethod("stats", long.class);
                    assertThat((long[]) stats.invoke(null, childSink)).hasSize(10);

                    // Registries are per library copy.
                    assertThatThrownBy(() -> NativeBridge.stats(childSink)).isInstanceOf(IllegalStateException.class);
                    Throwable t = causeOf(() -> stats.invoke(null, parentSink));
                    assertThat(t).isInstanceOf(IllegalStateException.class);

                    // Exceptions come from the child's own classes.
                    Method describe = bridge.getMethod("describeHandle", byte[].class);
                    Throwable state = causeOf(() -> describe.invoke(null, (Object) new byte[3]));
                    assertThat(state.getClass().getName()).isEqualTo("io.twopc.flink.TwopcStateException");
                    assertThat(state.getClass().getClassLoader()).isSameAs(loader);

                    bridge.getMethod("close", long.class).invoke(null, childSink);
                }
            }
            assertThat(NativeBridge.stats(parentSink)).hasSize(10);
            // Each copy was deleted once loaded: none is left in the JVM's delete-on-exit
            // list, which would grow by one entry per job restart for the TaskManager's life.
            assertThat(deleteOnExitEntries()).as("delete-on-exit entries").isEqualTo(deleteOnExit);
        } finally {
            NativeBridge.close(parentSink);
        }
    }

    @SuppressWarnings("unchecked")
    private static int deleteOnExitEntries() throws Exception {
        java.lang.reflect.Field files = Class.forName("java.io.DeleteOnExitHook").getDeclaredField("files");
        files.setAccessible(true);
        synchronized (Class.forName("java.io.DeleteOnExitHook")) {
            return ((java.util.Collection<String>) files.get(null)).size();
        }
    }

    /**
     * A finished job attempt must not pin its class loader (Flink creates one
     * per attempt; a pinned one leaks metaspace and a library copy each
     * restart). The library refers to Java classes through weak references
     * only, so the loader can be collected.
     */
    @Test
    public void aClassLoaderThatUsedTheLibraryCanBeCollected() throws Exception {
        // Logging must already be initialised, as it is in a TaskManager long
        // before any job: if the child's NativeLog were the first SLF4J caller,
        // log4j's initialisation (not the library) would keep the child.
        NativeBridge.ensureLoaded();
        org.slf4j.LoggerFactory.getLogger(NativeLoaderTest.class).info("logging initialised");
        WeakReference<ClassLoader> loader = useInChildLoader(tmp.newFolder("collect"));
        for (int i = 0; i < 100 && loader.get() != null; i++) {
            System.gc();
            byte[][] pressure = new byte[64][];
            for (int j = 0; j < pressure.length; j++) {
                pressure[j] = new byte[64 * 1024];
            }
            Thread.sleep(20);
        }
        assertThat(loader.get()).as("class loader collected").isNull();
    }

    /**
     * The release hook (issue: one mapped library copy per job class loader in a long-lived
     * TaskManager): in the class loader that owns its copy, it closes what a job left open, and
     * once that loader is collected the JVM unmaps the copy. In a loader that only shares a
     * parent's copy it does nothing.
     */
    @Test
    public void aReleasedCopyIsUnmappedWithItsClassLoaderAndASharedCopyIsLeftAlone() throws Exception {
        NativeBridge.ensureLoaded();
        org.slf4j.LoggerFactory.getLogger(NativeLoaderTest.class).info("logging initialised");
        long shared = openIn(NativeBridge.class, tmp.newFolder("shared"), "shared");
        try (ChildFirst job = new ChildFirst()) {
            // This test's copy belongs to the application class loader: a job loader under it
            // shares the copy, and its hook must leave the open sink alone.
            NativeBridge.releaseHookFor(job).run();
            assertThat(NativeBridge.stats(shared)).isNotEmpty();
        }
        java.util.Set<String> childCopy = new java.util.TreeSet<>();
        WeakReference<ClassLoader> loader = leaveOpenAndReleaseInChildLoader(tmp.newFolder("released"), childCopy);
        assertThat(childCopy).as("the child's own copy").hasSize(1);
        for (int i = 0; i < 200 && (loader.get() != null || mappedLibraryCopies().containsAll(childCopy)); i++) {
            System.gc();
            byte[][] pressure = new byte[64][];
            for (int j = 0; j < pressure.length; j++) {
                pressure[j] = new byte[64 * 1024];
            }
            Thread.sleep(25);
        }
        assertThat(loader.get()).as("class loader collected").isNull();
        assertThat(mappedLibraryCopies()).as("library copies mapped into this process")
                .doesNotContainAnyElementsOf(childCopy);
        assertThat(NativeBridge.stats(shared)).isNotEmpty();
        NativeBridge.close(shared);
    }

    private static WeakReference<ClassLoader> leaveOpenAndReleaseInChildLoader(File out, java.util.Set<String> copy)
            throws Exception {
        java.util.Set<String> before = mappedLibraryCopies();
        try (ChildFirst loader = new ChildFirst()) {
            Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
            openIn(bridge, out, "left-open");
            copy.addAll(mappedLibraryCopies());
            copy.removeAll(before);
            // A buffered write past the write-back threshold starts the copy's background thread.
            long threadsBefore = writebackThreads();
            // On a thread of its own that ends before the release, as a Flink task thread does:
            // a thread that called into a copy holds it mapped until the thread ends.
            long[] writing = new long[1];
            Throwable[] failed = new Throwable[1];
            Thread task = new Thread(() -> {
                try {
                    writing[0] = openBuffered(bridge, out);
                    byte[] handle = (byte[]) bridge.getMethod("begin", long.class).invoke(null, writing[0]);
                    // 256 records of 4 KiB back to back (no terminator), and their ends.
                    int records = 256;
                    int size = 4096;
                    java.nio.ByteBuffer batch = java.nio.ByteBuffer.allocateDirect(records * size);
                    while (batch.hasRemaining()) {
                        batch.put((byte) 'x');
                    }
                    java.nio.ByteBuffer ends = java.nio.ByteBuffer.allocateDirect(4 * records)
                            .order(java.nio.ByteOrder.LITTLE_ENDIAN);
                    for (int i = 0; i < records; i++) {
                        ends.putInt(4 * i, (i + 1) * size);
                    }
                    Method write = bridge.getMethod("write", long.class, byte[].class, java.nio.ByteBuffer.class,
                            int.class, java.nio.ByteBuffer.class, int.class, int.class);
                    for (int i = 0; i < 6; i++) {
                        write.invoke(null, writing[0], handle, batch, records * size, ends, records, -1);
                    }
                } catch (Throwable t) {
                    failed[0] = t;
                }
            }, "task");
            task.start();
            task.join();
            assertThat(failed[0]).as("the task's writes").isNull();
            // A new thread names itself once it runs: wait for that.
            assertThat(awaitWritebackThreads(threadsBefore + 1)).as("write-back threads while writing")
                    .isEqualTo(threadsBefore + 1);

            Runnable hook = (Runnable) bridge.getMethod("releaseHookFor", ClassLoader.class).invoke(null, loader);
            // The hook closes what the "job" left open and stops the thread; a second run
            // finds nothing.
            hook.run();
            assertThat(awaitWritebackThreads(threadsBefore)).as("write-back threads after the release")
                    .isEqualTo(threadsBefore);
            assertThat((int) bridge.getMethod("release").invoke(null)).isZero();
            Throwable closed = causeOf(() -> bridge.getMethod("stats", long.class).invoke(null, writing[0]));
            assertThat(closed).isInstanceOf(IllegalStateException.class);
            // A released copy opens nothing more (a task the release raced with fails cleanly).
            // Asked on a thread that ends, like the task's: a live thread that called into a
            // copy keeps it mapped (glibc keeps a library whose thread-local destructors are
            // pending).
            Throwable[] refused = new Throwable[1];
            Thread late = new Thread(() -> refused[0] = causeOf(() -> openIn(bridge, out, "after-release")),
                    "late-task");
            late.start();
            late.join();
            assertThat(refused[0]).isInstanceOf(IllegalStateException.class)
                    .hasMessageContaining("was released with its job's class loader");
            return new WeakReference<>(loader);
        }
    }

    /** A sink writing through the page cache (so with the background write-back). */
    private static long openBuffered(Class<?> bridge, File out) throws Exception {
        String config = NativeTestSupport.fsConfig(new File(out, "buffered"), "buffered", 3_600_000L)
                .replace("\"ioMode\":\"AUTO\"", "\"ioMode\":\"BUFFERED\"");
        assertThat(config).contains("BUFFERED");
        return openWith(bridge, config);
    }

    /** The number of write-back threads once it is {@code expected}, or after 10 s. */
    private static long awaitWritebackThreads(long expected) throws Exception {
        long deadline = System.nanoTime() + 10_000_000_000L;
        long count = writebackThreads();
        while (count != expected && System.nanoTime() < deadline) {
            Thread.sleep(10);
            count = writebackThreads();
        }
        return count;
    }

    /** Threads of this process named as the library's write-back thread. */
    private static long writebackThreads() throws java.io.IOException {
        try (java.util.stream.Stream<java.nio.file.Path> tasks = java.nio.file.Files.list(Paths.get("/proc/self/task"))) {
            return tasks.filter(t -> {
                try {
                    return new String(java.nio.file.Files.readAllBytes(t.resolve("comm")),
                            java.nio.charset.StandardCharsets.UTF_8).trim().equals("twopc-writeback");
                } catch (java.io.IOException e) {
                    return false; // the thread ended meanwhile
                }
            }).count();
        }
    }

    /** Paths of the twopc library files mapped into this process (each copy has its own name). */
    private static java.util.Set<String> mappedLibraryCopies() throws java.io.IOException {
        java.util.Set<String> copies = new java.util.TreeSet<>();
        for (String line : java.nio.file.Files.readAllLines(Paths.get("/proc/self/maps"))) {
            int at = line.indexOf('/');
            if (at >= 0 && line.contains("twopc-jni-")) {
                copies.add(line.substring(at));
            }
        }
        return copies;
    }

    private static WeakReference<ClassLoader> useInChildLoader(File out) throws Exception {
        try (ChildFirst loader = new ChildFirst()) {
            Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
            long sink = openIn(bridge, out, "child");
            // Throw and log through the child's classes too.
            assertThat(causeOf(() -> bridge.getMethod("describeHandle", byte[].class).invoke(null, (Object) new byte[3])))
                    .isNotNull();
            bridge.getMethod("close", long.class).invoke(null, sink);
            return new WeakReference<>(loader);
        }
    }

    /**
     * A library that cannot initialise (here: the log bridge class is missing) fails System.load
     * with a Java error, not a crash; every use then reports that original error.
     */
    @Test
    public void aLibraryThatCannotInitialiseFailsCleanly() throws Exception {
        try (ChildFirst loader = new ChildFirst("io.twopc.flink.internal.NativeLog")) {
            Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
            assertThat((boolean) bridge.getMethod("isLoaded").invoke(null)).isFalse();
            for (int attempt = 0; attempt < 2; attempt++) {
                Throwable t = causeOf(() -> bridge.getMethod("ensureLoaded").invoke(null));
                assertThat(t.getClass().getName()).startsWith("io.twopc.flink.Twopc");
                StringBuilder chain = new StringBuilder();
                for (Throwable c = t; c != null; c = c.getCause()) {
                    chain.append(c).append('\n');
                }
                assertThat(chain.toString()).contains("NativeLog");
            }
        }
    }

    /**
     * An exception other than UnsatisfiedLinkError left by the library's initialisation (here:
     * the log bridge's call into SLF4J fails, its LoggerFactory missing) comes out of System.load
     * as is. It is reported as the sink's error too, every time, and not left to break the
     * NativeBridge class for good ("Could not initialize class").
     */
    @Test
    public void anyErrorOfTheLibrarysInitialisationIsReportedAsTheSinksError() throws Exception {
        try (ChildFirst loader = new ChildFirst("org.slf4j.LoggerFactory")) {
            Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
            for (int attempt = 0; attempt < 2; attempt++) {
                Throwable t = causeOf(() -> bridge.getMethod("ensureLoaded").invoke(null));
                assertThat(t.getClass().getName()).as("attempt %s: %s", attempt, t)
                        .startsWith("io.twopc.flink.Twopc");
                StringBuilder chain = new StringBuilder();
                for (Throwable c = t; c != null; c = c.getCause()) {
                    chain.append(c).append('\n');
                }
                assertThat(chain.toString()).contains("LoggerFactory").contains("failed while initialising");
            }
        }
    }

    /**
     * A failed extraction (here: the directory for the copy is missing, as when a temporary
     * directory is full or cleaned) is retryable, and is tried again at the next use in the same
     * class loader: once the directory is there, the library loads and sinks open. Before, the
     * first failure was kept for good and every restart failed the same way.
     */
    @Test
    public void aFailedExtractionIsTriedAgainAtTheNextUse() throws Exception {
        File missing = new File(tmp.getRoot(), "not-yet");
        String before = System.getProperty(NativeLoader.TMPDIR_PROPERTY);
        try {
            System.setProperty(NativeLoader.TMPDIR_PROPERTY, missing.getPath());
            try (ChildFirst loader = new ChildFirst()) {
                Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
                assertThat((boolean) bridge.getMethod("isLoaded").invoke(null)).isFalse();
                for (int attempt = 0; attempt < 2; attempt++) {
                    Throwable t = causeOf(() -> bridge.getMethod("ensureLoaded").invoke(null));
                    assertThat(t.getClass().getName()).isEqualTo("io.twopc.flink.TwopcException");
                    assertThat(t).hasMessageContaining("could not extract");
                }
                assertThat(missing.mkdirs()).isTrue();
                bridge.getMethod("ensureLoaded").invoke(null);
                assertThat((boolean) bridge.getMethod("isLoaded").invoke(null)).isTrue();
                long sink = openIn(bridge, tmp.newFolder("after-retry"), "retried");
                bridge.getMethod("close", long.class).invoke(null, sink);
            }
        } finally {
            if (before == null) {
                System.clearProperty(NativeLoader.TMPDIR_PROPERTY);
            } else {
                System.setProperty(NativeLoader.TMPDIR_PROPERTY, before);
            }
        }
    }

    @Test
    public void theLibraryPropertyOverridesTheJar() throws Exception {
        URL packed = NativeBridge.class.getClassLoader().getResource("native/linux-x86_64/libtwopc_jni.so");
        String real = Paths.get(packed.toURI()).toString();
        String before = System.getProperty(NativeLoader.LIBRARY_PROPERTY);
        try {
            System.setProperty(NativeLoader.LIBRARY_PROPERTY, "/nonexistent/libtwopc_jni.so");
            try (ChildFirst loader = new ChildFirst()) {
                // The class initialises (a failed static initializer would leave every later
                // attempt with only "Could not initialize class"); each use reports the original
                // message, as a configuration error a restart cannot fix.
                Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
                assertThat((boolean) bridge.getMethod("isLoaded").invoke(null)).isFalse();
                for (int attempt = 0; attempt < 3; attempt++) {
                    Throwable t = causeOf(() -> bridge.getMethod("ensureLoaded").invoke(null));
                    assertThat(t.getClass().getName()).isEqualTo("io.twopc.flink.TwopcConfigException");
                    assertThat(t)
                            .hasMessageContaining(NativeLoader.LIBRARY_PROPERTY)
                            .hasMessageContaining("/nonexistent/libtwopc_jni.so");
                    assertThat(t.getCause()).isInstanceOf(UnsatisfiedLinkError.class);
                    Throwable atOpen = causeOf(() -> openIn(bridge, tmp.newFolder(), "never"));
                    assertThat(atOpen.getClass().getName()).isEqualTo("io.twopc.flink.TwopcConfigException");
                    assertThat(atOpen).hasMessage(t.getMessage());
                }
            }
            System.setProperty(NativeLoader.LIBRARY_PROPERTY, real);
            try (ChildFirst loader = new ChildFirst()) {
                Class<?> bridge = Class.forName(NativeBridge.class.getName(), true, loader);
                Throwable t = causeOf(() -> bridge.getMethod("stats", long.class).invoke(null, 12345L));
                assertThat(t).isInstanceOf(IllegalStateException.class);
            }
        } finally {
            if (before == null) {
                System.clearProperty(NativeLoader.LIBRARY_PROPERTY);
            } else {
                System.setProperty(NativeLoader.LIBRARY_PROPERTY, before);
            }
        }
    }

    /** Opens a sink through another class loader's copy of {@link NativeBridge}. */
    private static long openIn(Class<?> bridge, File out, String sinkId) throws Exception {
        return openWith(bridge, NativeTestSupport.fsConfig(out, sinkId, 3_600_000L));
    }

    private static long openWith(Class<?> bridge, String config) throws Exception {
        Method open = bridge.getMethod("openSink", String.class, String.class, int.class, int.class, int.class,
                long.class, String.class, long.class, byte[][].class, byte[][].class);
        return (long) open.invoke(null, config, NativeTestSupport.RUN_ID, 0, 1, 0, 10_000L, null, -1L,
                new byte[0][], new byte[0][]);
    }

    private interface Call {
        Object call() throws Exception;
    }

    private static Throwable causeOf(Call call) {
        try {
            call.call();
        } catch (InvocationTargetException e) {
            return e.getCause();
        } catch (Throwable e) {
            return e;
        }
        throw new AssertionError("expected an exception");
    }

    /** Loads io.twopc.* itself (classes and the packed library), everything else from the parent. */
    private static final class ChildFirst extends URLClassLoader {
        private final String hidden;

        ChildFirst() throws Exception {
            this("");
        }

        /** {@code hidden}: a class this loader pretends not to have. */
        ChildFirst(String hidden) throws Exception {
            super(roots(), NativeLoaderTest.class.getClassLoader());
            this.hidden = hidden;
        }

        private static URL[] roots() throws Exception {
            List<URL> urls = new ArrayList<>();
            urls.add(NativeBridge.class.getProtectionDomain().getCodeSource().getLocation());
            String resource = "native/linux-x86_64/libtwopc_jni.so";
            URL lib = NativeBridge.class.getClassLoader().getResource(resource);
            assertThat(lib).as(resource).isNotNull();
            String path = Paths.get(lib.toURI()).toString();
            urls.add(Paths.get(path.substring(0, path.length() - resource.length())).toUri().toURL());
            return urls.toArray(new URL[0]);
        }

        @Override
        protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
            if (name.equals(hidden)) {
                throw new ClassNotFoundException(name + " (hidden by the test)");
            }
            if (!name.startsWith("io.twopc.")) {
                return super.loadClass(name, resolve);
            }
            synchronized (getClassLoadingLock(name)) {
                Class<?> c = findLoadedClass(name);
                if (c == null) {
                    c = findClass(name);
                }
                if (resolve) {
                    resolveClass(c);
                }
                return c;
            }
        }

        @Override
        public URL getResource(String name) {
            URL own = findResource(name);
            return own != null ? own : super.getResource(name);
        }
    }
}
