#!/usr/bin/env bash
# The large crash simulation run (release build): in-memory, filesystem and
# object store schedules, after the scripted regression scenarios and the
# seeds that once failed. `scripts/test.sh` runs the small default
# (10,000 + 500 + 200). The object store schedules run against a local S3
# server (moto, `scripts/s3.sh`), started here and stopped at the end.
#
#   bash scripts/simulate.sh                            # 10,000,000 in-memory + 100,000 filesystem + 2,000 object store
#   bash scripts/simulate.sh --memory 2000000 --fs 20000 --obj 500
#   bash scripts/simulate.sh --part 2/4                 # the 2nd quarter of the seeds of both
#   bash scripts/simulate.sh --first-seed 5000000 --memory 1000000 --fs 0
#
# --part K/N runs the K-th of N contiguous slices of all three seed ranges, so that
# N runs (or machines) together cover exactly the run without --part. On a
# shared machine, prefix it with `nice -n 10`. Prints the coverage table and
# "simulation: <n> passed, <m> failed"; exits non-zero on any violation, with
# the trace of the first failing seed and the command that replays it.
# (--obj-first-seed K starts the object store seeds at 2000000000+K.)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh

memory=10000000
fs=100000
first=0
fs_first=0
obj=2000
obj_first=0
part=""
while [ $# -gt 0 ]; do
    case "$1" in
    --memory) memory=$2; shift 2 ;;
    --fs) fs=$2; shift 2 ;;
    --first-seed) first=$2; shift 2 ;;
    --fs-first-seed) fs_first=$2; shift 2 ;;
    --obj) obj=$2; shift 2 ;;
    --obj-first-seed) obj_first=$2; shift 2 ;;
    --part) part=$2; shift 2 ;;
    -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
    *) say "unknown option $1 (see --help)"; exit 2 ;;
    esac
done
for v in "$memory" "$fs" "$first" "$fs_first" "$obj" "$obj_first"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { say "not a count: $v"; exit 2; }
done

# slice TOTAL START K N -> "start count" of the K-th of N slices; the last
# slice takes the remainder.
slice() {
    local total=$1 start=$2 k=$3 n=$4 size
    size=$((total / n))
    if [ "$k" -eq "$n" ]; then
        echo "$((start + (k - 1) * size)) $((total - (k - 1) * size))"
    else
        echo "$((start + (k - 1) * size)) $size"
    fi
}
if [ -n "$part" ]; then
    [[ "$part" =~ ^([0-9]+)/([0-9]+)$ ]] || { say "--part wants K/N, e.g. 1/4"; exit 2; }
    k=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]}
    [ "$k" -ge 1 ] && [ "$k" -le "$n" ] || { say "--part $part: K must be in 1..N"; exit 2; }
    read -r first memory < <(slice "$memory" "$first" "$k" "$n")
    read -r fs_first fs < <(slice "$fs" "$fs_first" "$k" "$n")
    read -r obj_first obj < <(slice "$obj" "$obj_first" "$k" "$n")
fi

ensure_rust
if [ "$obj" -gt 0 ]; then
    trap 'bash scripts/s3.sh stop >/dev/null 2>&1 || true' EXIT
    eval "$(bash scripts/s3.sh start)"
fi
say "crash simulation: $memory in-memory schedules (seeds $first..$((first + memory))), $fs filesystem schedules (seeds 1000000000+$fs_first..), $obj object store schedules (seeds 2000000000+$obj_first..)"
started=$(date +%s)
TWOPC_SIM_SCHEDULES=$memory TWOPC_SIM_FIRST_SEED=$first \
    TWOPC_SIM_FS_SCHEDULES=$fs TWOPC_SIM_FS_FIRST_SEED=$fs_first \
    TWOPC_SIM_OBJ_SCHEDULES=$obj TWOPC_SIM_OBJ_FIRST_SEED=$obj_first \
    cargo test --release --locked -p twopc-sim --test simulation -- --nocapture
say "crash simulation: done in $(($(date +%s) - started)) s"
