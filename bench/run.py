#!/usr/bin/env python3
"""Runs the twopc benchmark and writes docs/bench/results.json (then report.py
writes docs/benchmarks.md and the plots). Started by scripts/bench.sh, which
builds the Java side, starts PostgreSQL and the local S3 server and passes the
classpath file.

Every Flink run is a JVM of its own (so heap and RSS are per run). The cases
run in rounds; each round runs every case once, in an order rotated from the
previous round's, so that drift of the machine (other load, page cache, disk
state) spreads over all cases instead of favouring one. Medians over rounds
are reported.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile

JDK_OPENS = [
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.text=ALL-UNNAMED",
    "--add-opens=java.base/java.time=ALL-UNNAMED",
    "--add-opens=java.base/java.math=ALL-UNNAMED",
    "--add-opens=java.sql/java.sql=ALL-UNNAMED",
    "--add-exports=java.base/sun.net.util=ALL-UNNAMED",
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED",
]
# A fixed heap, resident from the start, as a Flink task manager runs (it
# sets -Xms to -Xmx): the RSS of a run is then that heap plus what lives
# outside it (native memory, direct buffers, threads, code), and a sink that
# kept staged data in memory would show in the heap after GC or beyond it.
JVM_HEAP = ["-Xms1g", "-Xmx1g", "-XX:+AlwaysPreTouch"]

# Records per run, by mode. Sized so that a run's steady part lasts several
# seconds (full: tens of seconds) at the rates this machine reaches.
SIZES = {
    "full": {
        "discard": 100_000_000,
        "fs": 60_000_000,
        "filesink": 30_000_000,
        "fs-long": 120_000_000,  # 10 s checkpoints: gigabytes staged per transaction
        "filesink-long": 30_000_000,
        "raw-disk": 60_000_000,
        "pg": 4_000_000,
        # The object-store cases: the local S3 server (moto, Python) takes about 50 MB/s
        # here, and holds a run's objects in its memory until the run removes them.
        "s3": 6_000_000,
        # Runs of one case spread by up to a fifth on this machine; the
        # median of five is steadier than that of three.
        "rounds": 5,
        "jni_records": 2_000_000,
        "jni_rounds": 5,
    },
    "quick": {
        "discard": 8_000_000,
        "fs": 4_000_000,
        "filesink": 2_000_000,
        "fs-long": 4_000_000,
        "filesink-long": 2_000_000,
        "raw-disk": 4_000_000,
        "pg": 300_000,
        # 2 M: the steady part (10 % to 90 %) lasts about 3 s; at 0.5 M it is under half a
        # second, inside the first checkpoint interval.
        "s3": 2_000_000,
        "rounds": 3,
        "jni_records": 300_000,
        "jni_rounds": 3,
        # The interval sweep (0.1 s and 10 s) runs in the first round only, to stay within minutes.
        "sweep_rounds": 1,
    },
}

# (case name, sink, size key, checkpoint interval ms, needs PostgreSQL[, Flink line])
# The line is "1.20" unless a sixth element says "2.x" (the classpath of
# --classpath-2x-file: the same benchmark compiled against and run on 2.x).
# Sinks named *-s3 need the local S3 server (--s3-endpoint).
CASES = [
    ("discard", "discard", "discard", 1000, False),
    # The ceiling the brief asks for (source and serialisation cost only):
    # DiscardingSink fed through the byte-writing sinks' serialization schema.
    ("discard-serialized", "discard-serialized", "discard", 1000, False),
    ("twopc-fs", "twopc-fs", "fs", 1000, False),
    # The same with visible-first commits (CommitOrder.VISIBLE_FIRST, opt-in).
    ("twopc-fs-vf", "twopc-fs-vf", "fs", 1000, False),
    # The same destination through the SinkFunction shim (Flink 1.20's addSink).
    ("twopc-fs-sinkfunction", "twopc-fs-sinkfunction", "fs", 1000, False),
    ("filesink", "filesink", "filesink", 1000, False),
    ("twopc-pg-tx", "twopc-pg-tx", "pg", 1000, True),
    ("twopc-pg-idem", "twopc-pg-idem", "pg", 1000, True),
    # Every PostgreSQL case loads the same number of rows into the same
    # table: the cost of a row grows with the table (index depth, WAL,
    # checkpoints), so a smaller load would flatter the slower sink.
    ("jdbc-xa", "jdbc-xa", "pg", 1000, True),
    ("jdbc-xa-rewrite", "jdbc-xa-rewrite", "pg", 1000, True),
    ("raw-disk", "raw-disk", "raw-disk", 1000, False),
    ("raw-disk-direct", "raw-disk-direct", "raw-disk", 1000, False),
    ("raw-copy", "raw-copy", "pg", 1000, True),
    # The object store (issue 14): the same job into a bucket of the local S3 server, twopc
    # beside Flink's FileSink through its S3 filesystem plugin (flink-s3-fs-hadoop), both
    # exactly-once, both staging each checkpoint's output as multipart uploads of 8 MiB parts.
    ("twopc-s3", "twopc-s3", "s3", 1000, False),
    ("filesink-s3", "filesink-s3", "s3", 1000, False),
    # The interval sweep (1 s is the main run above).
    ("twopc-fs@100ms", "twopc-fs", "fs", 100, False),
    ("filesink@100ms", "filesink", "filesink", 100, False),
    ("twopc-fs@10s", "twopc-fs", "fs-long", 10000, False),
    ("filesink@10s", "filesink", "filesink-long", 10000, False),
    # Flink 2.x: the Sink V2 sinks, the same jar.
    ("discard-serialized@2.x", "discard-serialized", "discard", 1000, False, "2.x"),
    ("twopc-fs@2.x", "twopc-fs", "fs", 1000, False, "2.x"),
    ("twopc-fs-vf@2.x", "twopc-fs-vf", "fs", 1000, False, "2.x"),
    ("filesink@2.x", "filesink", "filesink", 1000, False, "2.x"),
]


def line_of(case):
    return case[5] if len(case) > 5 else "1.20"


def needs_s3(case):
    return case[1].endswith("-s3")


# The case JVMs' credentials for the local S3 server: it accepts any, and these
# keep a developer's own AWS settings (profile, session) out of the runs.
S3_ENV = {"AWS_ACCESS_KEY_ID": "twopc-bench", "AWS_SECRET_ACCESS_KEY": "twopc-bench-secret",
          "AWS_REGION": "us-east-1"}
S3_ENV_DROPPED = ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL"]

RUN_TIMEOUT_S = 15 * 60


def log(msg):
    print(f"[bench {datetime.datetime.now():%H:%M:%S}] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True, **kw)


def first_line(cmd):
    try:
        r = sh(cmd)
        out = (r.stdout or r.stderr).strip().splitlines()
        return out[0] if out else ""
    except OSError:
        return ""


def load_average():
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def machine_info(work_dir, pg_url, s3_endpoint=None, s3_plugins_dir=None):
    info = {}
    info["cores"] = os.cpu_count()
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info["cpu"] = cpu
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 1024 / 1024, 1)
    df = sh(["df", "-T", "-h", work_dir]).stdout.strip().splitlines()
    if len(df) > 1:
        fields = df[1].split()
        info["disk"] = f"{fields[0]} ({fields[1]}, {fields[2]} total, {fields[4]} free)"
        dev = os.path.basename(fields[0])
        rota = f"/sys/block/{re.sub(r'[0-9]+$', '', dev)}/queue/rotational"
        if os.path.exists(rota):
            with open(rota) as f:
                info["disk"] += (", virtual block device reporting itself rotational" if f.read().strip() == "1"
                                 else ", non-rotational")
    info["os"] = ""
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    info["os"] = line.split("=", 1)[1].strip().strip('"')
    info["kernel"] = platform.release()
    info["java"] = first_line("java -version 2>&1 | sed -n 2p")
    info["flink"] = "1.20.5 (MiniCluster, in-process)"
    info["flink_connector_jdbc"] = "3.3.0-1.20 (XA exactly-once sink)"
    info["postgresql_jdbc"] = "42.7.14"
    info["rustc"] = first_line("rustc --version")
    info["gradle"] = first_line("gradle --version 2>/dev/null | grep '^Gradle'")
    info["python"] = platform.python_version()
    if pg_url:
        info["postgresql_server"] = first_line(["psql", pg_url, "-X", "-A", "-t", "-c", "SHOW server_version"])
        info["psql"] = first_line("psql --version")
        info["postgresql_settings"] = first_line([
            "psql", pg_url, "-X", "-A", "-t", "-c",
            "SELECT string_agg(name || '=' || setting, ', ' ORDER BY name) FROM pg_settings WHERE name IN "
            "('shared_buffers','synchronous_commit','fsync','max_prepared_transactions','wal_level',"
            "'max_wal_size','checkpoint_timeout','wal_buffers')"])
    if s3_endpoint:
        python = os.environ.get("TWOPC_S3_PYTHON") or first_line("bash scripts/s3.sh python")
        moto = first_line([python, "-c", "import moto; print(moto.__version__)"]) if python else ""
        info["s3_server"] = (f"moto {moto} " if moto else "moto ") + \
            f"(scripts/s3.sh: in-memory, Python) at {s3_endpoint}"
    if s3_plugins_dir and os.path.isdir(os.path.join(s3_plugins_dir, "s3-fs-hadoop")):
        plugin = os.path.join(s3_plugins_dir, "s3-fs-hadoop")
        names = []
        for jar in sorted(j for j in os.listdir(plugin) if j.endswith(".jar")):
            m = re.match(r"(.*)-(\d[\w.]*)\.jar$", jar)
            name = f"{m.group(1)} {m.group(2)}" if m else jar
            # The Hadoop inside, from the build information Hadoop packs into its jars.
            try:
                with zipfile.ZipFile(os.path.join(plugin, jar)) as z:
                    props = z.read("common-version-info.properties").decode()
                hadoop = re.search(r"^version=(.+)$", props, re.M)
                if hadoop:
                    name += f", Hadoop S3A {hadoop.group(1).strip()} inside"
            except (KeyError, OSError, zipfile.BadZipFile):
                pass
            names.append(name)
        info["flink_s3_fs"] = "; ".join(names)
    return info


def snapshot_classpath(cp_file, dest):
    """Copies the build's class and resource directories aside: another
    build in the same tree (tests with fail points) must not swap the
    native library under a running benchmark."""
    with open(cp_file) as f:
        entries = f.read().strip().split(os.pathsep)
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    out = []
    for i, e in enumerate(entries):
        if os.path.isdir(e):
            copy = os.path.join(dest, f"{i:02d}-{os.path.basename(e)}")
            shutil.copytree(e, copy)
            out.append(copy)
        else:
            out.append(e)
    return os.pathsep.join(out)


def java_cmd(classpath, main, args, extra_jvm=()):
    return ["java", *JDK_OPENS, *JVM_HEAP, *extra_jvm, "-cp", classpath, main, *args]


def run_java_case(classpath, work, case_name, sink, records, interval_ms, pg_url, run_id, extra_jvm,
                  s3=None):
    """s3: None, or (endpoint, plugins dir) for the object-store cases."""
    run_dir = os.path.join(work, "out", f"{case_name}-{run_id}")
    out_json = os.path.join(work, "results", f"{case_name}-{run_id}.json")
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [f"--sink={sink}", f"--records={records}", f"--interval-ms={interval_ms}",
            f"--dir={run_dir}", f"--out={out_json}"]
    if pg_url:
        args.append(f"--pg-url={pg_url}")
    env = None
    if s3:
        args += [f"--s3-endpoint={s3[0]}", f"--s3-plugins-dir={s3[1]}"]
        env = {k: v for k, v in os.environ.items() if k not in S3_ENV_DROPPED}
        env.update(S3_ENV)
    started = time.time()
    try:
        proc = subprocess.run(java_cmd(classpath, "io.twopc.flink.bench.BenchJob", args, extra_jvm),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
        rc, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired:
        rc, stderr = -1, f"timed out after {RUN_TIMEOUT_S} s"
    result = None
    if os.path.exists(out_json):
        with open(out_json) as f:
            result = json.load(f)
    if result is None:
        result = {"sink": sink, "records": records, "intervalMs": interval_ms, "ok": False}
    if rc != 0 and not result.get("error"):
        result["error"] = stderr[-4000:]
    result["wallSeconds"] = time.time() - started
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def psql(pg_url, sql):
    r = subprocess.run(["psql", pg_url, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"psql failed: {r.stderr.strip()}")
    return r.stdout.strip()


def run_raw_copy(pg_url, copy_files, records):
    """`psql \\copy` of the same rows into the same (emptied) table, one psql
    per subtask's share, in parallel as the sink's subtasks write."""
    result = {"sink": "raw-copy", "records": records, "intervalMs": None, "parallelism": len(copy_files),
              "recordBytes": 100, "loadAvgStart": load_average()}
    psql(pg_url, "DROP TABLE IF EXISTS bench_rows; "
                 "CREATE TABLE bench_rows (id bigint PRIMARY KEY, payload text NOT NULL)")
    started = time.perf_counter()
    procs = [subprocess.Popen(["psql", pg_url, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c",
                               f"\\copy bench_rows (id, payload) FROM '{f}'"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in copy_files]
    errors = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            errors.append(err.strip())
    seconds = time.perf_counter() - started
    rows = int(psql(pg_url, "SELECT count(*) FROM bench_rows"))
    rate = records / seconds
    result.update({
        "recordsPerSec": rate, "endToEndRecordsPerSec": rate, "mbPerSec": rate * 100 / 1e6,
        "jobSeconds": seconds, "loadAvgEnd": load_average(),
        "verification": ("ok: " if rows == records and not errors else "failed: ") + f"{rows} rows"
                        + (f"; {errors}" if errors else ""),
        "ok": rows == records and not errors,
    })
    return result


def settle(pg_url):
    """Lets the previous run's writes reach the disk before the next run
    starts, so that no case pays for another's writeback: `sync`, and a
    PostgreSQL CHECKPOINT (which also writes out the server's dirty buffers
    and lets it recycle WAL segments)."""
    os.sync()
    if pg_url:
        psql(pg_url, "CHECKPOINT")
    os.sync()


def generate_copy_files(classpath, copy_dir, records):
    """The rows for `psql \\copy`: the same records, one file per subtask's share."""
    shutil.rmtree(copy_dir, ignore_errors=True)
    os.makedirs(copy_dir)
    out = os.path.join(copy_dir, "gen.json")
    args = ["--sink=copy-file", f"--records={records}", f"--dir={copy_dir}", f"--out={out}"]
    subprocess.run(java_cmd(classpath, "io.twopc.flink.bench.BenchJob", args), check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)["files"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small runs, finishes within minutes")
    ap.add_argument("--classpath-file", required=True)
    ap.add_argument("--classpath-2x-file", help="classpath of the Flink 2.x build (cases @2.x)")
    ap.add_argument("--work", default=os.environ.get("TWOPC_BENCH_WORK", "/tmp/twopc-bench"))
    ap.add_argument("--pg-url", default=os.environ.get("TWOPC_BENCH_PG_URL"))
    # Not TWOPC_S3_ENDPOINT: that is the test command's server, which the benchmark leaves alone.
    ap.add_argument("--s3-endpoint", default=os.environ.get("TWOPC_BENCH_S3_ENDPOINT"),
                    help="the local S3 server for the *-s3 cases (scripts/bench.sh starts one)")
    ap.add_argument("--s3-plugins-dir",
                    help="Flink plugins directory holding s3-fs-hadoop/ (default: plugins/ beside the "
                         "classpath file, where gradle benchClasspath puts it)")
    ap.add_argument("--out", default="docs/bench/results.json")
    ap.add_argument("--only", default="", help="comma-separated case names (for development)")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--command", default="bash scripts/bench.sh")
    ap.add_argument("--jvm-arg", action="append", default=[], help="extra JVM argument (profiling)")
    opts = ap.parse_args()

    mode = "quick" if opts.quick else "full"
    sizes = SIZES[mode]
    rounds = opts.rounds or sizes["rounds"]
    os.makedirs(opts.work, exist_ok=True)
    classpath = snapshot_classpath(opts.classpath_file, os.path.join(opts.work, "classpath"))
    classpaths = {"1.20": classpath}
    if opts.classpath_2x_file:
        classpaths["2.x"] = snapshot_classpath(opts.classpath_2x_file, os.path.join(opts.work, "classpath-2x"))
    shutil.rmtree(os.path.join(opts.work, "results"), ignore_errors=True)
    plugins_src = opts.s3_plugins_dir or os.path.join(os.path.dirname(os.path.abspath(opts.classpath_file)),
                                                      "plugins")
    plugins_dir = None
    if os.path.isdir(plugins_src):
        # A copy, as for the classpath: a rebuild must not change a plugin under a running benchmark.
        plugins_dir = os.path.join(opts.work, "plugins")
        shutil.rmtree(plugins_dir, ignore_errors=True)
        shutil.copytree(plugins_src, plugins_dir)

    only = [c for c in opts.only.split(",") if c]
    cases = [c for c in CASES if not only or c[0] in only]
    skipped = {}
    for c in cases:
        if line_of(c) not in classpaths:
            skipped[c[0]] = f"no Flink {line_of(c)} classpath (--classpath-2x-file)"
    cases = [c for c in cases if line_of(c) in classpaths]
    if not opts.pg_url:
        for c in cases:
            if c[4]:
                skipped[c[0]] = "no PostgreSQL server (TWOPC_BENCH_PG_URL unset)"
        cases = [c for c in cases if not c[4]]
    if not opts.s3_endpoint:
        for c in cases:
            if needs_s3(c):
                skipped[c[0]] = "no S3 server (--s3-endpoint / TWOPC_BENCH_S3_ENDPOINT unset)"
        cases = [c for c in cases if not needs_s3(c)]
    if not plugins_dir:
        for c in cases:
            if c[1] == "filesink-s3":
                skipped[c[0]] = f"no Flink S3 plugin in {plugins_src} (gradle benchClasspath lays it out)"
        cases = [c for c in cases if c[1] != "filesink-s3"]

    started = datetime.datetime.now(datetime.timezone.utc)
    log(f"{mode} run: {len(cases)} cases x {rounds} rounds; load average {load_average()}")
    machine = machine_info(opts.work, opts.pg_url, opts.s3_endpoint, plugins_dir)

    copy_files = []
    if any(c[1] == "raw-copy" for c in cases):
        copy_files = generate_copy_files(classpath, os.path.join(opts.work, "copy-rows"), sizes["pg"])

    runs = []
    for r in range(rounds):
        round_cases = [c for c in cases if c[3] == 1000 or r < sizes.get("sweep_rounds", rounds)]
        if not round_cases:
            # --only=jni: no job case, only the micro-benchmark below.
            break
        order = round_cases[r % len(round_cases):] + round_cases[:r % len(round_cases)]
        if r % 2 == 1:
            order = list(reversed(order))
        for case in order:
            (name, sink, size_key, interval) = case[:4]
            records = sizes[size_key]
            settle(opts.pg_url)
            log(f"round {r + 1}/{rounds}: {name} ({records:,} records, checkpoint every {interval} ms); "
                f"load {load_average()[0]}")
            if sink == "raw-copy":
                res = run_raw_copy(opts.pg_url, copy_files, records)
            else:
                res = run_java_case(classpaths[line_of(case)], opts.work, name, sink, records, interval,
                                    opts.pg_url if sink.startswith(("twopc-pg", "jdbc")) else None,
                                    f"r{r + 1}", opts.jvm_arg,
                                    (opts.s3_endpoint, plugins_dir) if needs_s3(case) else None)
            res["case"] = name
            res["round"] = r + 1
            res["flink"] = line_of(case)
            rate = res.get("recordsPerSec")
            log(f"  -> {'ok' if res.get('ok') else 'FAILED'}: "
                + (f"{rate:,.0f} records/s" if rate else "no rate")
                + ("" if res.get("ok") else f" ({(res.get('verification') or '')} {(res.get('error') or '')[-800:]})"))
            if (res.get("s3Cleanup") or "").startswith("failed"):
                # The server keeps what a run leaves in its memory, and later runs pay for it.
                log(f"  bucket not removed: {res['s3Cleanup'][:300]}")
            runs.append(res)

    jni = None
    if not only or "jni" in only:
        log("JNI micro-benchmark")
        jni_dir = "/dev/shm/twopc-bench-jni" if os.path.isdir("/dev/shm") else os.path.join(opts.work, "jni")
        jni_out = os.path.join(opts.work, "results", "jni.json")
        # The same writes into the measured disk (the sink's direct-I/O path), beside tmpfs.
        jni_disk_dir = os.path.join(opts.work, "jni-disk")
        shutil.rmtree(jni_dir, ignore_errors=True)
        shutil.rmtree(jni_disk_dir, ignore_errors=True)
        r = subprocess.run(java_cmd(classpath, "io.twopc.flink.bench.JniBench",
                                    [f"--dir={jni_dir}", f"--disk-dir={jni_disk_dir}", f"--out={jni_out}",
                                     f"--records={sizes['jni_records']}",
                                     f"--rounds={sizes['jni_rounds']}"]), capture_output=True, text=True)
        shutil.rmtree(jni_dir, ignore_errors=True)
        shutil.rmtree(jni_disk_dir, ignore_errors=True)
        if r.returncode == 0 and os.path.exists(jni_out):
            with open(jni_out) as f:
                jni = json.load(f)
        else:
            jni = {"error": r.stderr[-2000:]}

    for c in copy_files:
        try:
            os.remove(c)
        except OSError:
            pass

    finished = datetime.datetime.now(datetime.timezone.utc)
    doc = {
        "mode": mode,
        "command": opts.command + (" --quick" if opts.quick else ""),
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
        "rounds": rounds,
        "sizes": sizes,
        "cases": [{"case": c[0], "sink": c[1], "records": sizes[c[2]], "intervalMs": c[3], "flink": line_of(c)}
                  for c in cases],
        "skipped": skipped,
        "machine": machine,
        "jvm": JVM_HEAP + opts.jvm_arg,
        "runs": runs,
        "jni": jni,
    }
    os.makedirs(os.path.dirname(opts.out) or ".", exist_ok=True)
    with open(opts.out, "w") as f:
        json.dump(doc, f, indent=1)
    log(f"wrote {opts.out}")


if __name__ == "__main__":
    main()
