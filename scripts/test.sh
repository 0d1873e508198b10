#!/usr/bin/env bash
# Runs every test: Rust formatting and lints, the Rust core's unit tests,
# golden vectors, the crash simulation, the fuzz harness (100,000 inputs per
# decoder; `scripts/fuzz.sh` runs 10^7) and the SIGKILL test, then the Java
# tests (JNI bridge and Flink MiniCluster integration tests) on both Flink
# lines, the check of the jar users add, and the short cluster test (a Flink
# session cluster of separate JVMs on both lines, one TaskManager kill -9 each;
# `scripts/cluster-test.sh --full` runs every scenario).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
ensure_rust
ensure_java
ensure_gradle

# Each step says how long the one before it took, so that a slow run shows
# where the time went (the whole command should stay well under 45 minutes).
run_started=$SECONDS
step_started=$SECONDS
step_name=""
step() {
    if [ -n "$step_name" ]; then
        say "($step_name: $((SECONDS - step_started)) s)"
    fi
    step_name="$1"
    step_started=$SECONDS
    say "$1"
}

# Throw-away PostgreSQL servers on loopback for the PostgreSQL destination's
# tests: one with max_prepared_transactions set, a hot standby of it (a sink
# pointed at a standby must be refused by name), one with it at 0 (the
# start-up check must reject that). All are stopped and removed on exit.
# A local S3 server (moto, from PyPI into a venv) for the object-store
# destination's tests.
stop_servers() {
    TWOPC_PG_PORT=54331 bash scripts/postgres.sh stop >/dev/null 2>&1 || true
    bash scripts/postgres.sh stop >/dev/null 2>&1 || true
    TWOPC_PG_PORT=54330 bash scripts/postgres.sh stop >/dev/null 2>&1 || true
    bash scripts/s3.sh stop >/dev/null 2>&1 || true
}
trap stop_servers EXIT
# Each start's output is taken first, so that a server that did not start
# stops the run here (an `eval "$(...)"` would go on without it).
say "starting PostgreSQL test servers"
servers=$(bash scripts/postgres.sh start)
eval "$servers"
servers=$(TWOPC_PG_PORT=54331 TWOPC_PRIMARY_PORT=54329 bash scripts/postgres.sh standby)
eval "$servers"
servers=$(TWOPC_PG_PORT=54330 TWOPC_PG_MAX_PREPARED=0 bash scripts/postgres.sh start)
eval "$servers"
say "starting a local S3 server (moto)"
servers=$(bash scripts/s3.sh start)
eval "$servers"

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
step "cargo test (includes the fuzz run of rust/fuzz)"
cargo test --workspace --locked

# The integration tests inject faults through the core's fail points, so
# they run against a library built with the test-only feature. It shares the
# target directory with the jar's release build that follows, so that the
# dependencies are built once for both (a directory of its own would build
# them twice, minutes of this command); the switch rebuilds only our crates
# whose features differ. The jar check then confirms the library in the jar
# has no fail points.
step "gradle test test2x legacyTest (Java and Flink MiniCluster tests: Sink V2 on Flink 1.20 and 2.x, the SinkFunction shim on 1.20)"
gradle --no-daemon --continue test test2x legacyTest -PcargoFeatures=failpoints \
    -PcargoTargetDir="$PWD/target" -PpgUrl="$TWOPC_PG_URL" -PpgUrlNo2pc="$TWOPC_PG_URL_NO_2PC" \
    -Ps3Endpoint="$TWOPC_S3_ENDPOINT"

step "jar check (the jar users add: release library, no fail points, no Flink, POM published)"
bash scripts/check-jar.sh

step "cluster test, short (Flink session clusters of separate JVMs on 1.20 and 2.x, both front ends: kill -9 of a TaskManager running the sink, once per line)"
bash scripts/cluster-test.sh
step "all tests passed in $(( (SECONDS - run_started) / 60 )) min $(( (SECONDS - run_started) % 60 )) s"
