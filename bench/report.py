#!/usr/bin/env python3
"""Writes the benchmark report (Markdown and PNG plots) from the raw figures
that bench/run.py collected.

    python3 bench/report.py docs/bench/results.json docs/benchmarks.md

The plots go into the directory of the JSON file. bench/notes.md (the
analysis: profiles, what was changed, what remains) is appended as it is.
"""

import json
import math
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {
    "discard": "DiscardingSink (no serialization)",
    "discard-serialized": "DiscardingSink after serialization (ceiling)",
    "twopc-fs": "twopc, filesystem",
    "twopc-fs-vf": "twopc, filesystem, visible-first commits",
    "twopc-fs-vf@2.x": "twopc, filesystem, visible-first commits, Flink 2.x",
    "twopc-fs-sinkfunction": "twopc, filesystem (SinkFunction shim)",
    "filesink": "Flink FileSink (row format)",
    "twopc-pg-tx": "twopc, PostgreSQL transactional",
    "twopc-pg-idem": "twopc, PostgreSQL idempotent",
    "jdbc-xa": "Flink JDBC sink, exactly-once (XA)",
    "jdbc-xa-rewrite": "Flink JDBC XA sink + reWriteBatchedInserts",
    "raw-disk": "raw sequential disk write (page cache)",
    "raw-disk-direct": "raw sequential disk write (O_DIRECT)",
    "raw-copy": "psql \\copy",
    "discard-serialized@2.x": "DiscardingSink after serialization, Flink 2.x",
    "twopc-fs@2.x": "twopc, filesystem (Sink V2), Flink 2.x",
    "filesink@2.x": "Flink FileSink (row format), Flink 2.x",
    "twopc-s3": "twopc, object store (S3 multipart upload)",
    "filesink-s3": "Flink FileSink (row format) via flink-s3-fs-hadoop",
}
OBJECT_STORE = ["twopc-s3", "filesink-s3"]
MAIN_ORDER = ["discard", "discard-serialized", "twopc-fs", "twopc-fs-vf", "twopc-fs-sinkfunction", "filesink",
              "discard-serialized@2.x", "twopc-fs@2.x", "twopc-fs-vf@2.x", "filesink@2.x", "raw-disk", "raw-disk-direct", "twopc-pg-tx", "twopc-pg-idem", "jdbc-xa", "jdbc-xa-rewrite",
              "raw-copy"]
SWEEP = {"twopc-fs": ["twopc-fs@100ms", "twopc-fs", "twopc-fs@10s"],
         "filesink": ["filesink@100ms", "filesink", "filesink@10s"]}
INTERVALS = [100, 1000, 10000]
WARMUP_CHECKPOINTS = 2

# (name, numerator, denominator, target minimum, aim or None)
RATIOS = [
    # The ceiling as the brief defines it: "source and serialisation cost only".
    ("twopc-fs / DiscardingSink after serialization", "twopc-fs", "discard-serialized", 0.9, None),
    ("twopc-fs / FileSink", "twopc-fs", "filesink", 1.0, 1.5),
    ("Flink 2.x: twopc-fs / DiscardingSink after serialization", "twopc-fs@2.x", "discard-serialized@2.x", 0.9, None),
    ("Flink 2.x: twopc-fs / FileSink", "twopc-fs@2.x", "filesink@2.x", 1.0, None),
    ("twopc-fs: SinkFunction shim / Sink V2 (Flink 1.20)", "twopc-fs-sinkfunction", "twopc-fs", None, None),
    ("twopc-pg transactional / JDBC XA", "twopc-pg-tx", "jdbc-xa", None, None),
    ("twopc-pg transactional / psql \\copy", "twopc-pg-tx", "raw-copy", 1.2, None),
    ("twopc-fs / DiscardingSink (no serialization)", "twopc-fs", "discard", None, None),
    ("twopc-fs / raw disk write (page cache)", "twopc-fs", "raw-disk", None, None),
    ("twopc-fs / raw disk write (O_DIRECT)", "twopc-fs", "raw-disk-direct", 0.8, None),
    ("twopc-pg transactional / JDBC XA + reWriteBatchedInserts", "twopc-pg-tx", "jdbc-xa-rewrite", None, None),
    ("twopc-pg idempotent / JDBC XA", "twopc-pg-idem", "jdbc-xa", 2.0, None),
    ("twopc-pg idempotent / raw COPY", "twopc-pg-idem", "raw-copy", None, None),
    # The local S3 server is a Python process on the same cores: only the ratio carries over.
    ("object store: twopc-s3 / FileSink via flink-s3-fs-hadoop", "twopc-s3", "filesink-s3", None, None),
]


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def percentile(xs, p):
    """Nearest-rank percentile."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, math.ceil(p / 100 * len(s)) - 1)
    return s[k]


def fmt_int(x):
    return "—" if x is None else f"{x:,.0f}"


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def mib(x):
    return "—" if x is None else f"{x / 2**20:,.0f}"


class Results:
    def __init__(self, doc):
        self.doc = doc
        self.by_case = {}
        for r in doc["runs"]:
            if r.get("peakRssBytes") and r.get("maxHeapBytes"):
                r["nativeRssBytes"] = max(0, r["peakRssBytes"] - r["maxHeapBytes"])
            self.by_case.setdefault(r["case"], []).append(r)

    def ok_runs(self, case):
        return [r for r in self.by_case.get(case, []) if r.get("ok")]

    def failed_runs(self, case):
        return [r for r in self.by_case.get(case, []) if not r.get("ok")]

    def med(self, case, key):
        return median([r.get(key) for r in self.ok_runs(case)])

    def values(self, case, key):
        return [r.get(key) for r in self.ok_runs(case) if r.get(key) is not None]

    def paired_ratio(self, num, den):
        """Median over rounds of num/den within the same round (adjacent runs)."""
        nums = {r["round"]: r["recordsPerSec"] for r in self.ok_runs(num) if r.get("recordsPerSec")}
        dens = {r["round"]: r["recordsPerSec"] for r in self.ok_runs(den) if r.get("recordsPerSec")}
        return median([nums[k] / dens[k] for k in nums if k in dens])

    def ratio(self, num, den):
        a, b = self.med(num, "recordsPerSec"), self.med(den, "recordsPerSec")
        return a / b if a and b else None

    def latencies(self, case, warm=False):
        """Commit latencies of every run; with warm=True only those of checkpoints after each
        run's first WARMUP_CHECKPOINTS (a fresh JVM's first commits run cold code)."""
        out = []
        for r in self.ok_runs(case):
            lat = r.get("commitLatenciesMs") or []
            ids = r.get("commitLatencyCheckpoints") or [None] * len(lat)
            for ms, cid in zip(lat, ids):
                if not warm or (cid is not None and cid > WARMUP_CHECKPOINTS):
                    out.append(ms)
        return out

    def commit_calls(self, case, warm=False, key="commitCallMicros"):
        """twopc's own part of each commit, in ms: the native commit call (commitCallMicros,
        from the committers' commitDurationMicros histograms, one list per subtask in call
        order), or with key="commitVisibleMicros" its part until the output was visible.
        warm=True leaves out each subtask's first WARMUP_CHECKPOINTS calls."""
        out = []
        for r in self.ok_runs(case):
            for calls in r.get(key) or []:
                out.extend(us / 1000.0 for us in (calls[WARMUP_CHECKPOINTS:] if warm else calls))
        return out

    def why_missing(self, case):
        if case in self.doc.get("skipped", {}):
            return "not run: " + self.doc["skipped"][case]
        failed = self.failed_runs(case)
        if failed:
            err = (failed[0].get("error") or failed[0].get("verification") or "failed").strip()
            line = next((ln for ln in err.splitlines() if "Exception" in ln or "rror" in ln), err.splitlines()[0]
                        if err else "failed")
            return f"failed ({len(failed)} of {len(self.by_case[case])} runs): {line[:300]}"
        return "not run"


def plot_throughput(res, path):
    cases = [c for c in MAIN_ORDER if res.ok_runs(c)]
    if not cases:
        return False  # a partial run (scripts/bench.sh --only) of other cases
    fig, ax = plt.subplots(figsize=(9, 4.8))
    meds = [res.med(c, "recordsPerSec") for c in cases]
    lo = [m - min(res.values(c, "recordsPerSec")) for c, m in zip(cases, meds)]
    hi = [max(res.values(c, "recordsPerSec")) - m for c, m in zip(cases, meds)]
    colors = ["#888888" if c.startswith("discard") else "#bbbbbb" if c.startswith("raw") else
              "#1f77b4" if c.startswith("twopc") else "#ff7f0e" for c in cases]
    ax.barh([LABELS[c] for c in cases], meds, xerr=[lo, hi], color=colors, capsize=3)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("records/s (median, bars: min–max over rounds; log scale)")
    for i, (c, m) in enumerate(zip(cases, meds)):
        ax.text(max(res.values(c, "recordsPerSec")) * 1.08, i, f"{m:,.0f}/s  {m * 100 / 1e6:.0f} MB/s",
                va="center", fontsize=8)
    ax.set_xlim(right=max(max(res.values(c, "recordsPerSec")) for c in cases) * 5)
    ax.set_title("Throughput per sink (100-byte records, p=2, checkpoint every 1 s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_ratios(res, path):
    rows = [(name, res.ratio(n, d), tmin, aim) for name, n, d, tmin, aim in RATIOS if res.ratio(n, d)]
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    names = [r[0] for r in rows]
    vals = [r[1] for r in rows]
    colors = ["#2ca02c" if (r[2] is None or r[1] >= r[2]) else "#d62728" for r in rows]
    ax.barh(names, vals, color=colors)
    for i, r in enumerate(rows):
        ax.text(r[1], i, f"  {r[1]:.2f}", va="center", fontsize=9)
        if r[2] is not None:
            ax.plot([r[2], r[2]], [i - 0.4, i + 0.4], color="black", lw=2)
        if r[3] is not None:
            ax.plot([r[3], r[3]], [i - 0.4, i + 0.4], color="black", lw=1, ls="--")
    ax.invert_yaxis()
    ax.axvline(1.0, color="#999999", lw=0.8)
    ax.set_xlabel("ratio of median throughputs (black bar: target, dashed: aim; green: target met)")
    ax.set_title("Ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_latency(res, path):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    any_data = False
    for case, color in [("twopc-fs", "#1f77b4"), ("filesink", "#ff7f0e")]:
        lat = sorted(res.latencies(case))
        if not lat:
            continue
        any_data = True
        ys = [(i + 1) / len(lat) for i in range(len(lat))]
        # Log scale: a 0 ms sample (under the clock's resolution) is drawn at 0.5 ms.
        ax.step([max(x, 0.5) for x in lat], ys, where="post", color=color,
                label=f"{LABELS[case]} (n={len(lat)}, p99 {percentile(lat, 99)} ms)")
    if not any_data:
        plt.close(fig)
        return False
    ax.axvline(20, color="black", lw=1, ls="--", label="target p99 < 20 ms (twopc-fs)")
    ax.set_xscale("log")
    ticks = [1, 2, 5, 10, 20, 50, 100, 200, 500]
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("ms from checkpoint completion (last ack at the job manager) to the output file visible")
    ax.set_ylabel("fraction of commits")
    ax.set_title("Commit latency distribution (checkpoint every 1 s)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_memory(res, path):
    fig, axes = plt.subplots(1, 4, figsize=(15, 4))
    keys = [("peakHeapAfterGcBytes", "peak heap after GC (MiB)"),
            ("peakRssBytes", "peak RSS (MiB)"),
            ("nativeRssBytes", "peak RSS beyond the heap (MiB)"),
            ("peakHeapUsedBytes", "peak heap in use, garbage incl. (MiB)")]
    any_data = False
    for ax, (key, title) in zip(axes, keys):
        for sink, color in [("twopc-fs", "#1f77b4"), ("filesink", "#ff7f0e")]:
            xs, ys = [], []
            for interval, case in zip(INTERVALS, SWEEP[sink]):
                v = res.med(case, key)
                if v is not None:
                    xs.append(interval / 1000)
                    ys.append(v / 2**20)
            if xs:
                any_data = True
                ax.plot(xs, ys, marker="o", color=color, label=LABELS[sink])
        ax.set_xscale("log")
        ax.set_xticks([0.1, 1, 10])
        ax.set_xticklabels(["0.1", "1", "10"])
        ax.set_xlabel("checkpoint interval (s)")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, max([ln.get_ydata().max() for ln in ax.get_lines()] or [1]) * 1.2)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Memory of the job's JVM against the checkpoint interval (medians)")
    fig.tight_layout()
    if any_data:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return any_data


def plot_sweep(res, path):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    any_data = False
    for sink, color in [("twopc-fs", "#1f77b4"), ("filesink", "#ff7f0e")]:
        xs, ys = [], []
        for interval, case in zip(INTERVALS, SWEEP[sink]):
            v = res.med(case, "recordsPerSec")
            if v is not None:
                xs.append(interval / 1000)
                ys.append(v)
        if xs:
            any_data = True
            ax.plot(xs, ys, marker="o", color=color, label=LABELS[sink])
    if not any_data:
        plt.close(fig)
        return False
    ax.set_xscale("log")
    ax.set_xticks([0.1, 1, 10])
    ax.set_xticklabels(["0.1", "1", "10"])
    ax.set_xlabel("checkpoint interval (s)")
    ax.set_ylabel("records/s (median)")
    ax.set_ylim(0, max(ln.get_ydata().max() for ln in ax.get_lines()) * 1.15)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Throughput against checkpoint interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_jni(jni, path):
    rows = (jni or {}).get("results") or []
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [r["batchRecords"] for r in rows]
    ys = [r["nsPerRecord"] for r in rows]
    ax.plot(xs, ys, marker="o")
    ax.axvline(jni["defaultBatchRecords"], color="black", ls="--", lw=1,
               label=f"default batch ({jni['defaultBatchRecords']} records)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("records per NativeBridge.write call")
    ax.set_ylabel("ns per record (median)")
    ax.set_title("JNI write cost per record against batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def history_section(json_dir):
    """The commit-history benchmark (`bash scripts/bench.sh --history`), if
    its figures are next to results.json."""
    path = os.path.join(json_dir, "history.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)
    out = ["## Commit history: open, recover and inspect against its length", "",
           "From `bash scripts/bench.sh --history` (figures in [`bench/history.json`](bench/history.json)): "
           "one subtask commits one transaction per checkpoint through the real protocol, the "
           "committer's housekeeping after each checkpoint; then, median of 5: *open + recover* is "
           "the restore from the last checkpoint (ownership, rewind detection, the recovery commit "
           "of its handle found already committed), *fresh-start check* the lineage summary every "
           "fresh start reads, *inspect* the `twopc inspect --json` binary at its default depth. "
           "*folded* is the default (older commit records folded into history segments); *single* "
           "keeps one commit record per transaction forever (compaction off), as releases before "
           "this one did. Built on tmpfs: it measures the history's cost, not the disk.", "",
           "| history | transactions | control files | open + recover (ms) | fresh-start check (ms) | inspect (ms) |",
           "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['history']} | {fmt_int(r['transactions'])} | {fmt_int(r['control_files'])} | "
                   f"{r['open_recover_ms']:.2f} | {r['fresh_start_check_ms']:.2f} | {r['inspect_ms']:.2f} |")
    out.append("")
    for mode in ["folded", "single"]:
        rs = [r for r in rows if r["history"] == mode]
        if len(rs) < 2:
            continue
        a, b = rs[0], rs[-1]
        out.append(f"* {mode}: from {fmt_int(a['transactions'])} to {fmt_int(b['transactions'])} "
                   f"transactions, open + recover ×{b['open_recover_ms'] / a['open_recover_ms']:.1f}, "
                   f"fresh-start check ×{b['fresh_start_check_ms'] / a['fresh_start_check_ms']:.1f}, "
                   f"inspect ×{b['inspect_ms'] / a['inspect_ms']:.1f}")
    out.append("")
    return out


def object_store_section(res, doc):
    """twopc and FileSink into the local S3 server, side by side, if either ran (or was meant to)."""
    if not any(c in res.by_case or c in doc.get("skipped", {}) for c in OBJECT_STORE):
        return []
    m = doc.get("machine", {})
    sizes = doc.get("sizes", {})
    polls = [r.get("visibilityPollMs") for c in OBJECT_STORE for r in res.ok_runs(c) if r.get("visibilityPollMs")]
    poll = f"{polls[0]} ms" if polls else "a fixed interval"
    out = ["## Object store (local S3 server)", "",
           "The same job (records, parallelism, 1 s exactly-once checkpoints) into a bucket of a local "
           "S3 server: **twopc** (`TwopcSink.forObjectStore`, one multipart upload per transaction, "
           "completed when its checkpoint completes) beside **Flink's FileSink** (row format, the same "
           "encoder and rolling on every checkpoint as the filesystem case) writing to `s3://` through "
           f"Flink's S3 filesystem plugin ({m.get('flink_s3_fs', 'flink-s3-fs-hadoop')}), loaded from a "
           "plugins directory in a class loader of its own, as on a Flink cluster. FileSink's S3 writer also stages each part file as a multipart upload "
           "completed at the checkpoint's completion; both upload parts of 8 MiB (twopc's default, set as "
           "FileSink's `s3.upload.min.part.size`). Path-style requests over plain HTTP, the same "
           f"credentials. {sizes.get('s3', 0):,} records per run. Each run creates a bucket of its own, "
           "reads it back through the S3 API as any reader would (ListObjectsV2 + GetObject: every "
           "record exactly once, byte for byte, and no multipart upload left incomplete), then "
           "removes it.", "",
           f"**Read the ratio, not the figures.** The server is {m.get('s3_server', 'moto (scripts/s3.sh)')}: "
           "an S3 implementation in Python that keeps every object in its own memory and runs on the "
           "same two cores as the job. Each part crosses its HTTP handling and is copied in memory "
           "(and again when the upload completes), so the absolute rates measure the server as much "
           "as the sink, and say nothing about a real object store, where the network and the store "
           "bound both sinks instead. Both sinks pay the same server, so their ratio is what carries over.",
           "",
           "| sink | records/s (median) | MB/s | min – max records/s | end-to-end records/s | commits "
           "| commit latency p50 / p99 / max ms | runs ok |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in OBJECT_STORE:
        runs = res.by_case.get(c, [])
        if not res.ok_runs(c):
            out.append(f"| {LABELS[c]} | {res.why_missing(c)} | | | | | | {len(res.ok_runs(c))}/{len(runs)} |")
            continue
        vals = res.values(c, "recordsPerSec")
        lat = res.latencies(c)
        lat_cell = (f"{percentile(lat, 50)} / {percentile(lat, 99)} / {max(lat)}" if lat else "—")
        out.append(f"| {LABELS[c]} | {fmt_int(res.med(c, 'recordsPerSec'))} | {fmt(res.med(c, 'mbPerSec'), 1)} | "
                   f"{fmt_int(min(vals)) if vals else '—'} – {fmt_int(max(vals)) if vals else '—'} | "
                   f"{fmt_int(res.med(c, 'endToEndRecordsPerSec'))} | {len(lat)} | {lat_cell} | "
                   f"{len(res.ok_runs(c))}/{len(runs)} |")
    out.append("")
    r = res.ratio("twopc-s3", "filesink-s3")
    e2e_a, e2e_b = res.med("twopc-s3", "endToEndRecordsPerSec"), res.med("filesink-s3", "endToEndRecordsPerSec")
    if r is not None:
        out.append(f"**twopc / FileSink on the object store: {r:.2f}** as a ratio of median steady rates "
                   f"({fmt(res.paired_ratio('twopc-s3', 'filesink-s3'))} as the median of the ratios within "
                   "a round)"
                   + (f"; end to end (submission to the last commit, start-up included) {e2e_a / e2e_b:.2f}"
                      if e2e_a and e2e_b else "") + ".")
    else:
        out.append("No ratio: " + res.why_missing("twopc-s3" if not res.ok_runs("twopc-s3") else "filesink-s3"))
    out.append("")
    out.append(f"Commit latency here is from a checkpoint's completion (last acknowledgement, as above) to the "
               f"object appearing in the bucket's listing, which a run polls every {poll} (an object store "
               "notifies no reader): each figure is late by up to one poll and one listing. twopc's objects "
               "are matched to their checkpoint through its commit records, FileSink's to the last checkpoint "
               "completed before they appeared.")
    out.append("")
    return out


def main():
    src, md_path = sys.argv[1], sys.argv[2]
    with open(src) as f:
        doc = json.load(f)
    res = Results(doc)
    plot_dir = os.path.dirname(os.path.abspath(src))
    rel = os.path.relpath(plot_dir, os.path.dirname(os.path.abspath(md_path)))

    def img(name):
        return f"![{name}]({rel}/{name})"

    out = []
    w = out.append
    m = doc["machine"]
    loads = [r.get("loadAvgStart", [None])[0] for r in doc["runs"] if r.get("loadAvgStart")]
    w("# twopc benchmarks")
    w("")
    w(f"Written by `{doc['command']}` ({doc['mode']} run, {doc['started']} to {doc['finished']}); "
      f"do not edit by hand: run the command again. Raw figures: "
      f"[`{rel}/results.json`]({rel}/results.json).")
    w("")
    w("The question: what does an exactly-once sink cost against the sink one would use otherwise? "
      "Every figure below comes from one run of the command on one machine, the sinks side by side, "
      "and is read against its peer, its ceiling or the physical limit rather than alone.")
    w("")
    w("## Machine")
    w("")
    w("| | |")
    w("|---|---|")
    for key, label in [("cores", "cores"), ("cpu", "CPU"), ("memory_gib", "memory (GiB)"), ("disk", "disk"),
                       ("os", "OS"), ("kernel", "kernel"), ("java", "JVM"), ("flink", "Flink"),
                       ("flink_connector_jdbc", "flink-connector-jdbc"), ("postgresql_jdbc", "PostgreSQL JDBC"),
                       ("postgresql_server", "PostgreSQL server"), ("postgresql_settings", "server settings"),
                       ("psql", "psql"), ("s3_server", "S3 server"), ("flink_s3_fs", "Flink S3 filesystem"),
                       ("rustc", "Rust"), ("gradle", "Gradle"), ("python", "Python")]:
        if m.get(key) not in (None, ""):
            w(f"| {label} | {m[key]} |")
    if loads:
        w(f"| load average (1 min; it includes the benchmark's own previous run) at the start of each run | "
          f"median {median(loads):.2f}, "
          f"max {max(loads):.2f} |")
    w(f"| JVM options per run | {' '.join(doc.get('jvm', []))} (plus the `--add-opens` Flink needs) |")
    w("")
    w("## The job and the method")
    w("")
    w("* The same job for every sink: `fromSequence(1, N)` → a map that turns each number into a "
      "record of 99 characters (`<20-digit id>\\t<payload>`; with the newline the sinks append, "
      "100 bytes; the same bytes are a COPY text row `(id bigint, payload text)` for PostgreSQL) → the sink. "
      "Parallelism 2, everything chained, exactly-once checkpoints every second (the sweep: 0.1 s and 10 s), "
      "no restarts, a Flink MiniCluster in a JVM of its own per run (one task manager, two slots).")
    w(f"* {doc['rounds']} rounds; each round runs every case once, in an order rotated (and reversed every "
      "other round) from the previous one, so that drift of the machine spreads over all cases. "
      "Medians over rounds are reported; ratios are ratios of medians (and, beside them, the median of "
      "the ratios within a round).")
    w("* **Throughput** is the steady rate: records accepted by the sink between 10 % and 90 % of the "
      "input (sampled every 20 ms in the job's JVM), so start-up and the final checkpoint are left out. "
      "The end-to-end rate (all records, from submission until the job finished, i.e. until the last "
      "output was committed) is in the JSON and in the table. Every run checks its output: the visible files hold exactly "
      "N × 100 bytes, or the table holds N distinct ids.")
    sizes = doc["sizes"]
    w(f"* Records per run (sized so that each run lasts several seconds or more at its own rate; a file "
      f"sink's rate does not depend on the count): both DiscardingSink cases {sizes['discard']:,}; twopc-fs and raw disk "
      f"{sizes['fs']:,} ({sizes['fs-long']:,} at 10 s checkpoints); FileSink {sizes['filesink']:,} "
      f"({sizes['filesink-long']:,} at 10 s); every PostgreSQL case (both twopc modes, both JDBC XA "
      f"variants, psql) {sizes['pg']:,} rows, the same for all because a row costs more the larger the "
      f"table grows.")
    w("* **Between runs** the machine settles: `sync`, and a PostgreSQL `CHECKPOINT`, so that no run "
      "pays for the previous run's writeback. The PostgreSQL server runs with bulk-load settings "
      "(listed under Machine): with the defaults (`max_wal_size` 1 GB) it checkpoints every few seconds "
      "during a load and logs a hint to raise `max_wal_size`.")
    w("* **The ceiling**: the brief defines it as DiscardingSink, \"source and serialisation cost only\". "
      "Flink's `DiscardingSink` drops the record object without turning it into bytes, so the run "
      "named *DiscardingSink after serialization* feeds each record through the serialization schema "
      "the byte-writing sinks use (`SimpleStringSchema`: the string's UTF-8 bytes) and drops the "
      "bytes. The target is read against it; the plain DiscardingSink is shown beside it.")
    w("* **Raw disk write**: the same 100-byte lines (a 1 MB block of them, written repeatedly) by two "
      "threads into two files in the same directory, each fsynced every second and at the end; once "
      "through the page cache (plain `write`), once with O_DIRECT (blocks of 4096 lines, 409,600 bytes, "
      "from an aligned buffer straight to the disk). "
      "**psql \\copy**: the same rows, one `psql -c '\\copy bench_rows FROM file'` per subtask's half, "
      "in parallel, into the same table (`id bigint PRIMARY KEY, payload text`), emptied before each run.")
    w("* **Commit latency**: from a checkpoint's completion (taken as its last acknowledgement at the job "
      "manager, which the completion follows by its finalisation: the figures are if anything high) to "
      "the moment its output file became visible in the output directory (inotify). twopc's files are "
      "matched to their checkpoint exactly (through the commit records); FileSink's to the last "
      "checkpoint completed before the file appeared.")
    w("* **Memory**: of the run's JVM, which holds the whole cluster. Its heap is fixed and resident "
      "from the start (`-Xms` = `-Xmx`, pre-touched), as on a Flink task manager. Peak heap after GC "
      "(the live set: the largest post-collection usage of the heap pools) shows what the job keeps on "
      "the heap; peak RSS (`VmHWM` of /proc/self/status) minus the heap shows what it keeps outside it "
      "(native memory, direct buffers, threads, code). Peak heap in use (JMX, sampled every 20 ms) "
      "counts garbage not yet collected, so it follows the garbage collector's sizing of the young "
      "generation, not what the sink holds.")
    w("")

    # Throughput table.
    w("## Throughput")
    w("")
    w("| sink | records/s (median) | MB/s | min – max records/s | end-to-end records/s | runs ok |")
    w("|---|---:|---:|---:|---:|---:|")
    for c in MAIN_ORDER:
        runs = res.by_case.get(c, [])
        if not res.ok_runs(c):
            w(f"| {LABELS[c]} | {res.why_missing(c)} | | | | {len(res.ok_runs(c))}/{len(runs)} |")
            continue
        vals = res.values(c, "recordsPerSec")
        w(f"| {LABELS[c]} | {fmt_int(res.med(c, 'recordsPerSec'))} | {fmt(res.med(c, 'mbPerSec'), 1)} | "
          f"{fmt_int(min(vals))} – {fmt_int(max(vals))} | {fmt_int(res.med(c, 'endToEndRecordsPerSec'))} | "
          f"{len(res.ok_runs(c))}/{len(runs)} |")
    w("")
    if plot_throughput(res, os.path.join(plot_dir, "throughput.png")):
        w(img("throughput.png"))
        w("")

    # Ratios.
    w("## Ratios")
    w("")
    w("| ratio | of medians | median within a round | target | met |")
    w("|---|---:|---:|---|---|")
    for name, n, d, tmin, aim in RATIOS:
        r = res.ratio(n, d)
        p = res.paired_ratio(n, d)
        target = "—" if tmin is None else f"≥ {tmin}" + (f" (aim {aim})" if aim else "")
        met = "—" if tmin is None or r is None else ("yes" if r >= tmin else "**no**")
        if aim and r is not None and r >= tmin:
            met += f", aim {'reached' if r >= aim else 'not reached'}"
        if r is None:
            missing = n if not res.ok_runs(n) else d
            w(f"| {name} | — | — | {target} | {res.why_missing(missing)} |")
        else:
            w(f"| {name} | {r:.2f} | {fmt(p)} | {target} | {met} |")
    w("")
    if plot_ratios(res, os.path.join(plot_dir, "ratios.png")):
        w(img("ratios.png"))
        w("")

    # Latency.
    w("## Commit latency: checkpoint completion → output visible")
    w("")
    w(f"All commits, and (\"warm\") without those of each run's first {WARMUP_CHECKPOINTS} checkpoints: every "
      "run is a fresh JVM, whose first commits run through cold (interpreted, not yet compiled) code "
      "on the job manager's and the task's side.")
    w("")
    w("| sink | checkpoint every | commits | p50 ms | p99 ms | max ms | warm: commits | p50 | p99 | max |")
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in ["twopc-fs", "twopc-fs-vf", "filesink", "twopc-fs@100ms", "filesink@100ms", "twopc-fs@10s", "filesink@10s"]:
        lat = res.latencies(c)
        if not lat:
            continue
        warm = res.latencies(c, warm=True)
        interval = {"@100ms": "0.1 s", "@10s": "10 s"}.get(c[c.find("@"):] if "@" in c else "", "1 s")
        base = c.split("@")[0]
        w(f"| {LABELS[base]} | {interval} | {len(lat)} | {percentile(lat, 50)} | {percentile(lat, 99)} | "
          f"{max(lat)} | {len(warm)} | {fmt_int(percentile(warm, 50))} | {fmt_int(percentile(warm, 99))} | "
          f"{fmt_int(max(warm) if warm else None)} |")
    w("")
    if plot_latency(res, os.path.join(plot_dir, "latency.png")):
        w(img("latency.png"))
        w("")
    w("### twopc's own part: the commit call")
    w("")
    w("From the start of the native commit call until it returned, the output visible (the latency above "
      "minus the checkpoint's finalisation and Flink's notification path), as twopc's committers record "
      "it in their `commitDurationMicros` histogram; warm leaves out each committer's first "
      f"{WARMUP_CHECKPOINTS} calls.")
    w("")
    rows = []
    own_fs_warm = res.commit_calls("twopc-fs", warm=True)
    for c in ["twopc-fs", "twopc-fs-vf", "twopc-fs@100ms", "twopc-fs@10s", "twopc-fs@2.x", "twopc-fs-vf@2.x",
              "twopc-fs-sinkfunction", "twopc-pg-tx", "twopc-pg-idem", "twopc-s3"]:
        calls = res.commit_calls(c)
        if calls:
            rows.append((LABELS.get(c, c), calls, res.commit_calls(c, warm=True)))
    # A run without them (recorded before the benchmark collected them): separate runs of
    # twopc-fs kept beside the results, if any.
    extra = os.path.join(os.path.dirname(os.path.abspath(src)), "commit-calls.json")
    if not rows and os.path.exists(extra):
        with open(extra) as f:
            cc = json.load(f)
        w(f"Not recorded by the runs above; from separate runs: {cc.get('note', '')} "
          "(`bench/commit-calls.json`).")
        w("")
        for line in sorted({r["flink"] for r in cc["runs"]}):
            lists = [l for r in cc["runs"] if r["flink"] == line for l in r["commitCallMicros"]]
            calls = [us / 1000.0 for l in lists for us in l]
            warm = [us / 1000.0 for l in lists for us in l[WARMUP_CHECKPOINTS:]]
            rows.append((f"twopc, filesystem, Flink {line}", calls, warm))
            if line == "1.20":
                own_fs_warm = warm
    if rows:
        w("| sink | calls | p50 ms | p99 ms | max ms | warm: calls | p50 | p99 | max |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, calls, warm in rows:
            w(f"| {label} | {len(calls)} | {fmt(percentile(calls, 50))} | {fmt(percentile(calls, 99))} | "
              f"{fmt(max(calls))} | {len(warm)} | {fmt(percentile(warm, 50))} | {fmt(percentile(warm, 99))} | "
              f"{fmt(max(warm) if warm else None)} |")
    else:
        w("Not recorded in this run.")
    w("")
    # Until visible: the filesystem destination shows the output (a hard link) before it makes
    # the commit durable, and tells when (its committers' commitVisibleMicros histogram).
    vis_rows = []
    for c in ["twopc-fs", "twopc-fs-vf", "twopc-fs@100ms", "twopc-fs@10s", "twopc-fs@2.x", "twopc-fs-vf@2.x",
              "twopc-fs-sinkfunction"]:
        vis = res.commit_calls(c, key="commitVisibleMicros")
        if vis:
            vis_rows.append((LABELS.get(c, c), vis, res.commit_calls(c, warm=True, key="commitVisibleMicros")))
    if vis_rows:
        w("The same calls from their start until the output was visible, as the committers record it "
          "in their `commitVisibleMicros` histogram. Durable-first (the default) publishes after the "
          "claim and the commit record are synced; visible-first (`CommitOrder.VISIBLE_FIRST`, opt-in) "
          "links the output to its visible name before any sync:")
        w("")
        w("| sink | calls | p50 ms | p99 ms | max ms | warm: calls | p50 | p99 | max |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, calls, warm in vis_rows:
            w(f"| {label} | {len(calls)} | {fmt(percentile(calls, 50))} | {fmt(percentile(calls, 99))} | "
              f"{fmt(max(calls))} | {len(warm)} | {fmt(percentile(warm, 50))} | {fmt(percentile(warm, 99))} | "
              f"{fmt(max(warm) if warm else None)} |")
        w("")

    for line in object_store_section(res, doc):
        w(line)

    # JNI.
    jni = doc.get("jni") or {}
    w("## JNI cost per record: batching against one call per record")
    w("")
    if jni.get("results"):
        rows = jni["results"]
        one = rows[0]["nsPerRecord"]
        dflt = next((r["nsPerRecord"] for r in rows if r["batchRecords"] == jni["defaultBatchRecords"]), None)
        w(f"`NativeBridge.write` of 100-byte records (collected by the sink's own RecordBatcher as TwopcSink does: each record and its line break in one direct buffer, its end offset in another) into "
          f"the {jni.get('destination', 'filesystem destination on tmpfs')}, {jni['rounds']} rounds in "
          "rotating order, medians. The default batch is "
          f"**{jni['defaultBatchRecords']} records or {jni['defaultBatchBytes'] // 1024} KiB, whichever "
          "fills first** (`TwopcSinkBuilder.DEFAULT_BATCH_SIZE` / `DEFAULT_BATCH_BYTES`), and a batch is "
          "also sent at every checkpoint.")
        w("")
        w("| records per call | ns per record | against one call per record |")
        w("|---:|---:|---:|")
        for r in rows:
            w(f"| {r['batchRecords']:,} | {r['nsPerRecord']:.0f} | "
              + ("(baseline) |" if r is rows[0] else f"{one / r['nsPerRecord']:.1f}× cheaper |"))
        w("")
        if dflt:
            w(f"One call per record costs {one:.0f} ns per record; with the default batch, {dflt:.0f} ns "
              f"(crossing, handle check and the destination's write together): the crossing itself "
              f"is about {one - dflt:.0f} ns per call, {(one - dflt) / jni['defaultBatchRecords']:.2f} ns per "
              "record when batched.")
            w("")
        framing = jni.get("framingOnlyNsPerRecord")
        disk = jni.get("diskNsPerRecord")
        if framing is not None and dflt:
            w("At the default batch, split up:")
            w("")
            w("| path | ns per record |")
            w("|---|---:|")
            w(f"| framing alone (the RecordBatcher filling its buffers, no native call) | {framing:.1f} |")
            w(f"| framing + JNI + native write, tmpfs (as above) | {dflt:.1f} |")
            cpu = jni.get("diskCpuNsPerRecord")
            if disk is not None:
                w(f"| framing + JNI + native write, the measured disk ({jni.get('diskDestination', '')}: "
                  f"direct-I/O chunks, written by the destination's I/O thread), wall time | {disk:.1f} |")
            if cpu is not None:
                w(f"| the same, the task thread's CPU time (waiting for the disk left out) | {cpu:.1f} |")
            w("")
            target = cpu if cpu is not None else dflt
            w(f"Target: JNI, framing and the native write at ≤ 10 ns per record at the default batch: "
              f"{target:.1f} ns ({'met' if target <= 10 else '**not met**'}; on the disk the sink writes to "
              "when measured there, the task thread's CPU time).")
            w("")
        if plot_jni(jni, os.path.join(plot_dir, "jni.png")):
            w(img("jni.png"))
            w("")
    else:
        w(f"Not measured: {jni.get('error', 'not run')[:300]}")
        w("")

    # Memory.
    w("## Memory against checkpoint interval")
    w("")
    w("Staged records go to the destination (the staging file), not to memory, so memory should not "
      "grow with the data a checkpoint holds (10 s at these rates is over a gigabyte per subtask).")
    w("")
    w("| sink | checkpoint interval | peak heap in use MiB | peak heap after GC MiB | peak RSS MiB | "
      "RSS beyond the heap MiB |")
    w("|---|---|---:|---:|---:|---:|")
    spreads = {}
    for sink in ["twopc-fs", "filesink"]:
        for interval, case in zip(INTERVALS, SWEEP[sink]):
            if not res.ok_runs(case):
                continue
            w(f"| {LABELS[sink]} | {interval / 1000:g} s | {mib(res.med(case, 'peakHeapUsedBytes'))} | "
              f"{mib(res.med(case, 'peakHeapAfterGcBytes'))} | {mib(res.med(case, 'peakRssBytes'))} | "
              f"{mib(res.med(case, 'nativeRssBytes'))} |")
        for key in ["peakHeapUsedBytes", "peakHeapAfterGcBytes", "peakRssBytes", "nativeRssBytes"]:
            vals = [res.med(c, key) for c in SWEEP[sink] if res.med(c, key)]
            if len(vals) == 3:
                spreads[(sink, key)] = (max(vals) - min(vals)) / min(vals)
    w("")
    if spreads:
        w("Spread across the three intervals, (max − min) / min of the medians:")
        w("")
        w("| sink | heap in use | heap after GC | RSS | RSS beyond the heap |")
        w("|---|---:|---:|---:|---:|")
        for sink in ["twopc-fs", "filesink"]:
            cells = [spreads.get((sink, k)) for k in ["peakHeapUsedBytes", "peakHeapAfterGcBytes", "peakRssBytes",
                                                       "nativeRssBytes"]]
            w(f"| {LABELS[sink]} | " + " | ".join("—" if c is None else f"{100 * c:.0f} %" for c in cells) + " |")
        w("")
    if plot_memory(res, os.path.join(plot_dir, "memory.png")):
        w(img("memory.png"))
        w("")

    # Sweep.
    w("## Throughput against checkpoint interval")
    w("")
    w("| sink | 0.1 s | 1 s | 10 s |")
    w("|---|---:|---:|---:|")
    for sink in ["twopc-fs", "filesink"]:
        w(f"| {LABELS[sink]} | " + " | ".join(fmt_int(res.med(c, "recordsPerSec")) for c in SWEEP[sink]) + " |")
    w("")
    if plot_sweep(res, os.path.join(plot_dir, "sweep.png")):
        w(img("sweep.png"))
        w("")

    for line in history_section(plot_dir):
        w(line)

    # Targets.
    w("## Targets")
    w("")
    w("| target | figure | met |")
    w("|---|---|---|")

    def target_row(label, value, ok, shown):
        w(f"| {label} | {shown if value is not None else '—'} | "
          f"{'—' if value is None else ('yes' if ok else '**no**')} |")

    for name, n, d, tmin, aim in RATIOS:
        if tmin is None:
            continue
        r = res.ratio(n, d)
        target_row(f"{name} ≥ {tmin}" + (f" (aim {aim})" if aim else ""), r, r is not None and r >= tmin,
                   f"{r:.2f}" if r else "")
    lat = res.latencies("twopc-fs")
    p99 = percentile(lat, 99)
    target_row("twopc-fs commit latency p99 < 20 ms (1 s checkpoints, all commits)", p99,
               p99 is not None and p99 < 20, f"{p99} ms")
    warm = res.latencies("twopc-fs", warm=True)
    p99w = percentile(warm, 99)
    target_row(f"twopc-fs commit latency p99 < 20 ms (1 s checkpoints, warm: checkpoints "
               f"> {WARMUP_CHECKPOINTS} of each run)", p99w, p99w is not None and p99w < 20, f"{p99w} ms")
    # Until visible where the runs recorded it (both Flink lines), else the whole call (an upper
    # bound: it goes on after the output is visible). One row per commit order.
    for label, case_120, case_2x in [("durable-first, the default", "twopc-fs", "twopc-fs@2.x"),
                                     ("visible-first, opt-in", "twopc-fs-vf", "twopc-fs-vf@2.x")]:
        vis_120 = res.commit_calls(case_120, warm=True, key="commitVisibleMicros")
        vis_2x = res.commit_calls(case_2x, warm=True, key="commitVisibleMicros")
        if not vis_120:
            continue
        own99 = percentile(vis_120, 99)
        own99_2x = percentile(vis_2x, 99) if vis_2x else None
        worst = max(v for v in [own99, own99_2x] if v is not None)
        target_row(f"twopc-fs own commit (commit call start → output visible) p99 ≤ 2 ms (warm; {label})",
                   worst, worst <= 2 and own99_2x is not None,
                   f"{fmt(own99)} ms on 1.20" + (f", {fmt(own99_2x)} ms on 2.x" if own99_2x is not None
                                                 else ", 2.x not run"))
    if not res.commit_calls("twopc-fs", warm=True, key="commitVisibleMicros"):
        own99 = percentile(own_fs_warm, 99)
        target_row("twopc-fs own commit (commit call start → output visible) p99 ≤ 2 ms (warm)", own99,
                   own99 is not None and own99 <= 2,
                   f"{fmt(own99)} ms (the whole call)" if own99 is not None else "")
    fs_warm = res.latencies("filesink", warm=True)
    fs99 = percentile(fs_warm, 99)
    target_row("twopc-fs end-to-end commit latency p99 no worse than FileSink's (warm, 1 s checkpoints)",
               p99w if fs99 is not None else None, p99w is not None and fs99 is not None and p99w <= fs99,
               f"{p99w} ms against {fs99} ms")
    for key, label in [("peakHeapAfterGcBytes", "heap after GC"), ("peakRssBytes", "RSS"),
                       ("nativeRssBytes", "RSS beyond the heap"), ("peakHeapUsedBytes", "heap in use, garbage included")]:
        s = spreads.get(("twopc-fs", key))
        target_row(f"twopc-fs memory flat within 10 % across 0.1 / 1 / 10 s ({label})", s,
                   s is not None and s <= 0.10, f"{100 * s:.0f} %" if s is not None else "")
    w("")

    failed = [r for r in doc["runs"] if not r.get("ok")]
    if failed or doc.get("skipped"):
        w("## Runs that failed or did not run")
        w("")
        for case, why in doc.get("skipped", {}).items():
            w(f"* {case}: {why}")
        for r in failed:
            err = (r.get("error") or r.get("verification") or "").strip().splitlines()
            w(f"* {r['case']} round {r.get('round')}: {err[0][:300] if err else 'failed'}")
        w("")

    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "notes.md")
    if os.path.exists(notes):
        with open(notes) as f:
            w(f.read().rstrip())
        w("")

    with open(md_path, "w") as f:
        f.write("\n".join(out))
    print(f"wrote {md_path} and plots in {plot_dir}")


if __name__ == "__main__":
    main()
