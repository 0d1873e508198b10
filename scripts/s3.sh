#!/usr/bin/env bash
# A throw-away local S3 server (moto) for the twopc-objstore tests.
#
#   scripts/s3.sh start    create the venv if absent (pip install moto[server]),
#                          start moto_server on loopback, wait until it answers,
#                          print the endpoint to export
#   scripts/s3.sh stop     stop the server this script started
#   scripts/s3.sh status   exit 0 when running
#   scripts/s3.sh python   print the venv's python (the tests create buckets
#                          with its boto3)
#
# `start` prints one line on stdout, an export of the endpoint, so
#   eval "$(bash scripts/s3.sh start)"
# sets TWOPC_S3_ENDPOINT (and TWOPC_S3_PYTHON) in the calling shell.
# Everything else goes to stderr.
#
# moto keeps its state in memory: a restart forgets every bucket, which is
# what the tests want (each test creates its own bucket anyway).
#
# Environment:
#   TWOPC_S3_PORT   port on 127.0.0.1 (default 54371)
#   TWOPC_S3_VENV   the virtualenv (default /tmp/twopc-s3-venv)
set -euo pipefail

PORT="${TWOPC_S3_PORT:-54371}"
VENV="${TWOPC_S3_VENV:-/tmp/twopc-s3-venv}"
STATE="/tmp/twopc-s3-$PORT"
PIDFILE="$STATE/moto.pid"
LOG="$STATE/moto.log"
MOTO_VERSION=5.2.5

say() { printf '[s3.sh] %s\n' "$*" >&2; }

running() {
    [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null
}

answers() {
    "$VENV/bin/python" - "$PORT" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen("http://127.0.0.1:%s/moto-api/" % sys.argv[1], timeout=1)
EOF
}

ensure_venv() {
    if [ -x "$VENV/bin/moto_server" ] && "$VENV/bin/python" -c 'import boto3' 2>/dev/null; then
        return
    fi
    say "creating $VENV and installing moto[server]==$MOTO_VERSION (once)"
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            say "installing python3-venv (Debian's package)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >&2
        else
            say "missing: Python's venv module. Install it with: sudo apt-get install -y python3-venv"
            exit 3
        fi
    fi
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --quiet "moto[server]==$MOTO_VERSION" boto3 >&2
}

exports() {
    echo "export TWOPC_S3_ENDPOINT=http://127.0.0.1:$PORT TWOPC_S3_PYTHON=$VENV/bin/python"
}

case "${1:-}" in
start)
    ensure_venv
    mkdir -p "$STATE"
    if running; then
        say "already running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
    else
        # setsid: the server outlives this script and the shell that ran it.
        setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 < /dev/null &
        echo $! >"$PIDFILE"
        for _ in $(seq 1 100); do
            answers && break
            if ! running; then
                say "moto_server exited at start; its log ($LOG):"
                tail -n 20 "$LOG" >&2
                exit 1
            fi
            sleep 0.1
        done
        if ! answers; then
            say "moto_server does not answer on 127.0.0.1:$PORT after 10 s; see $LOG"
            exit 1
        fi
        say "moto_server $MOTO_VERSION up on 127.0.0.1:$PORT (pid $(cat "$PIDFILE"), log $LOG)"
    fi
    exports
    ;;
stop)
    if running; then
        kill "$(cat "$PIDFILE")"
        say "stopped pid $(cat "$PIDFILE")"
    else
        say "not running"
    fi
    rm -f "$PIDFILE"
    ;;
status)
    if running && answers; then
        say "running (pid $(cat "$PIDFILE")) on 127.0.0.1:$PORT"
        exit 0
    fi
    say "not running"
    exit 1
    ;;
python)
    echo "$VENV/bin/python"
    ;;
*)
    say "usage: $0 start|stop|status|python"
    exit 2
    ;;
esac
