#!/usr/bin/env bash
# Builds everything and runs the demo job: one million numbered records
# through the twopc sink on an in-process Flink cluster, with one injected
# failure, into a local directory; then verifies the output is exactly once.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
ensure_rust
ensure_java
ensure_gradle
exec gradle --no-daemon -q runDemo "$@"
