#!/usr/bin/env bash
# The long fuzz run: every decoder of checkpoint state and destination
# files (rust/fuzz), 10^7 inputs each by default, in a release build. The
# test command runs the same harness with 100,000 inputs per decoder.
#
#   bash scripts/fuzz.sh                          # 10^7 inputs per target, seeds 0..10^7
#   bash scripts/fuzz.sh --inputs 1e6 --seed 42   # other counts and seeds
#   bash scripts/fuzz.sh --seed random            # a seed drawn now (it is printed)
#   bash scripts/fuzz.sh --seeds 1e7..2e7         # a seed range, to split a run among machines
#   bash scripts/fuzz.sh handle commit            # only targets whose names contain a word
#   bash scripts/fuzz.sh --replay handle 1234     # one input from its seed: hex dump and outcome
#   bash scripts/fuzz.sh --hex handle 54575043... # one input given as hex
#   bash scripts/fuzz.sh --list                   # the targets
#
# A failure (panic, a decode over 1 s, an allocation over 64 MiB) prints the
# target, the seed, the input and the command that replays it, and the run
# exits non-zero. TWOPC_FUZZ_INPUTS, TWOPC_FUZZ_SEED and TWOPC_FUZZ_HANG_MS
# set the defaults of --inputs, --seed and --hang-ms.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
ensure_rust

args=("$@")
count_given=
for a in "$@"; do
    case "$a" in
        --inputs | --seeds | --replay | --hex | --list | -h | --help) count_given=1 ;;
    esac
done
if [ -z "$count_given" ] && [ -z "${TWOPC_FUZZ_INPUTS:-}" ]; then
    args=(--inputs 1e7 "${args[@]}")
fi

exec cargo test --release --locked -q -p twopc-fuzz --test fuzz -- "${args[@]}"
