#!/usr/bin/env bash
# The benchmark: what does twopc cost against the sink one would use
# otherwise? Runs the same Flink job (numbered 100-byte records, parallelism
# 2, exactly-once checkpoints every second) on the in-process cluster into
# each sink in turn, in alternating rounds, plus the physical limits (raw
# disk write, psql \copy) and a JNI micro-benchmark; then writes the report.
# The object-store cases run the same job into a local S3 server: twopc beside
# Flink's FileSink through its S3 filesystem plugin.
#
#   bash scripts/bench.sh           full run (about half an hour); writes
#                                   docs/benchmarks.md, docs/bench/*.png and
#                                   docs/bench/results.json
#   bash scripts/bench.sh --quick   small runs (under 5 minutes); writes the
#                                   same report to build/bench/quick/
#   bash scripts/bench.sh --history only the commit-history benchmark (about a
#                                   minute): docs/bench/history.json
#   bash scripts/bench.sh [--quick] --only=CASE,CASE
#                                   only the named cases (bench/run.py's
#                                   CASES, e.g. --only=twopc-s3,filesink-s3),
#                                   for development: the report goes to
#                                   build/bench/only/, never to docs/
#
# Installs what it needs when run as root on Debian (a JDK, Gradle,
# PostgreSQL, matplotlib), or says what to install. Starts a throw-away
# PostgreSQL server on 127.0.0.1:${TWOPC_BENCH_PG_PORT:-54339} and a local S3
# server (moto, scripts/s3.sh) on 127.0.0.1:${TWOPC_BENCH_S3_PORT:-54372}
# (their own ports, so that a concurrent test run's servers are left alone)
# and stops both at the end. Figures mean something only on a quiet machine:
# the report records the load average before and during every run.
#
# Environment: TWOPC_BENCH_WORK (scratch directory for the runs' output,
# default /tmp/twopc-bench: it is the disk that is measured),
# TWOPC_BENCH_CARGO_TARGET_DIR (cargo target directory, default ./target).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh

QUICK=""
HISTORY=""
ONLY=""
for arg in "$@"; do
    case "$arg" in
    --quick) QUICK="--quick" ;;
    --history) HISTORY=1 ;;
    --only=?*) ONLY="${arg#--only=}" ;;
    *)
        say "usage: bash scripts/bench.sh [--quick] [--history] [--only=CASE,CASE,...]"
        exit 2
        ;;
    esac
done

ensure_rust

# --history: only the commit-history benchmark (open-and-recover, the
# fresh-start check and inspect against 10^2..10^5 committed transactions,
# folded and single; about a minute, 10^2..10^4 with --quick).
if [ -n "$HISTORY" ]; then
    # The PostgreSQL half measures a throw-away server of its own port.
    export TWOPC_PG_PORT="${TWOPC_BENCH_PG_PORT:-54339}"
    trap 'bash scripts/postgres.sh stop >/dev/null 2>&1 || true' EXIT
    eval "$(TWOPC_PG_MAX_PREPARED=64 bash scripts/postgres.sh start)"
    cargo build --release --locked -p twopc-cli --bin twopc --example history-bench
    if [ -n "$QUICK" ]; then
        mkdir -p build/bench/quick
        HISTORY_JSON=build/bench/quick/history.json
    else
        HISTORY_JSON=docs/bench/history.json
    fi
    "${CARGO_TARGET_DIR:-target}/release/examples/history-bench" $QUICK --json "$HISTORY_JSON"
    exit 0
fi
ensure_java
ensure_gradle

ensure_plotting() {
    if python3 -c 'import matplotlib' >/dev/null 2>&1; then
        return 0
    fi
    say "matplotlib is missing (for the plots); installing it with pip"
    if python3 -m pip install -q matplotlib >/dev/null 2>&1 \
        || python3 -m pip install -q --user matplotlib >/dev/null 2>&1; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt_install python3-matplotlib
        return 0
    fi
    say "missing: matplotlib. Install it with: python3 -m pip install matplotlib (or sudo apt-get install -y python3-matplotlib)"
    exit 3
}
if ! command -v python3 >/dev/null 2>&1; then
    need_root_or_explain python3 "Python 3"
    apt_install python3
fi
ensure_plotting

if [ -n "$ONLY" ]; then
    # A partial run must not replace the published report.
    OUT_DIR="build/bench/only"
elif [ -n "$QUICK" ]; then
    OUT_DIR="build/bench/quick"
else
    OUT_DIR="docs"
fi

say "load average before the run: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"

export TWOPC_PG_PORT="${TWOPC_BENCH_PG_PORT:-54339}"
# scripts/s3.sh reads TWOPC_S3_PORT; the test command's server (54371) stays untouched.
export TWOPC_S3_PORT="${TWOPC_BENCH_S3_PORT:-54372}"
stop_servers() {
    bash scripts/postgres.sh stop >/dev/null 2>&1 || true
    bash scripts/s3.sh stop >/dev/null 2>&1 || true
}
trap stop_servers EXIT
say "starting PostgreSQL on 127.0.0.1:$TWOPC_PG_PORT"
# Bulk-load settings, as a server taking a stream of loads would have them:
# with the defaults (max_wal_size 1GB) PostgreSQL checkpoints every few
# seconds during a 4-million-row load and logs a hint to raise max_wal_size.
# The same server serves every PostgreSQL case.
export TWOPC_PG_SETTINGS="max_wal_size = 8GB; checkpoint_timeout = 30min; shared_buffers = 2GB; wal_buffers = 64MB"
eval "$(TWOPC_PG_MAX_PREPARED=64 bash scripts/postgres.sh start)"
say "starting the local S3 server (moto) on 127.0.0.1:$TWOPC_S3_PORT"
eval "$(bash scripts/s3.sh start)"

say "building the JNI library (release) and the benchmark classes"
gradle --no-daemon -q benchClasspath bench2xClasspath \
    -PcargoTargetDir="${TWOPC_BENCH_CARGO_TARGET_DIR:-$PWD/target}"

mkdir -p "$OUT_DIR/bench"
python3 bench/run.py $QUICK \
    --classpath-file build/bench/classpath.txt \
    --classpath-2x-file build/bench/classpath-2x.txt \
    --pg-url "$TWOPC_PG_URL" \
    --s3-endpoint "$TWOPC_S3_ENDPOINT" \
    --s3-plugins-dir build/bench/plugins \
    ${ONLY:+--only "$ONLY" --command "bash scripts/bench.sh --only=$ONLY"} \
    --out "$OUT_DIR/bench/results.json"
python3 bench/report.py "$OUT_DIR/bench/results.json" "$OUT_DIR/benchmarks.md"
say "report: $OUT_DIR/benchmarks.md"
