#!/usr/bin/env bash
# Builds everything and runs the demo job: one million numbered records
# through the twopc sink on an in-process Flink cluster, with one injected
# failure, into a local directory; then verifies the output is exactly once.
#
#   bash scripts/demo.sh                          # into build/demo-out/, Flink 1.20
#   bash scripts/demo.sh --flink 2                # the same on Flink 2.x (the same jar)
#   bash scripts/demo.sh --destination postgres   # into table twopc_demo
#
# With --destination postgres the server is the one in TWOPC_PG_URL; when that
# is unset, the throw-away test server of scripts/postgres.sh is started (and
# left running: `bash scripts/postgres.sh stop` removes it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh

destination=directory
flink=1.20
gradle_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --destination)
        [ $# -ge 2 ] || { say "--destination needs a value: directory or postgres"; exit 2; }
        destination="$2"
        shift 2
        ;;
    --destination=*)
        destination="${1#--destination=}"
        shift
        ;;
    --flink)
        [ $# -ge 2 ] || { say "--flink needs a value: 1.20 or 2"; exit 2; }
        flink="$2"
        shift 2
        ;;
    --flink=*)
        flink="${1#--flink=}"
        shift
        ;;
    *)
        gradle_args+=("$1")
        shift
        ;;
    esac
done
case "$destination" in
directory | postgres) ;;
*)
    say "unknown destination '$destination'; use --destination directory (the default) or --destination postgres"
    exit 2
    ;;
esac

case "$flink" in
1.20 | 1.20.* | 2 | 2.*) ;;
*)
    say "unknown Flink line '$flink'; use --flink 1.20 (the default) or --flink 2"
    exit 2
    ;;
esac

ensure_rust
ensure_java
ensure_gradle
if [ "$destination" = postgres ] && [ -z "${TWOPC_PG_URL:-}" ]; then
    say "TWOPC_PG_URL is not set: starting the local PostgreSQL server of scripts/postgres.sh"
    eval "$(bash scripts/postgres.sh start)"
fi
exec gradle --no-daemon -q runDemo -PdemoDestination="$destination" -PdemoFlink="$flink" \
    ${gradle_args[@]+"${gradle_args[@]}"}
