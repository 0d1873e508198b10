#!/usr/bin/env python3
"""Where a visible-first commit's time until visible goes, commit by commit:
on a core, waiting in the run queue for one, or blocked in the kernel.

It reads a scheduler and system-call trace of a benchmark run of the
`twopc-fs-vf` case, taken with perf (root, or perf_event_paranoid <= 1):

    perf record -e sched:sched_switch -e sched:sched_wakeup \\
        -e syscalls:sys_enter_openat -e syscalls:sys_enter_renameat2 \\
        -e syscalls:sys_exit_linkat -a -o perf.data -- \\
        java ... io.twopc.flink.bench.BenchJob --sink=twopc-fs-vf ...
    perf script -i perf.data -F comm,tid,cpu,time,event,trace > trace.txt
    python3 bench/commit_wait.py trace.txt

A visible-first commit of the filesystem destination makes the same calls
each time: it reads the commit record and opens two directories (three
`openat`), claims the transaction (`renameat2`), opens the claim, and links
the staged data to its visible name (`linkat`). Any thread that calls
`linkat` is a committing thread; a commit's window runs from the first of
those three `openat` to the `linkat`'s return. The time between the
commit call's start and its first system call is not in the trace (no
marker), so a window is a lower bound of the `commitVisibleMicros` the job
records.

Within a window, the thread is on a core, or off it: preempted (the switch
says state R), which is time in the run queue, or asleep (D: blocked in the
kernel, S: waiting), which is blocked time until its wake-up and run-queue
time after it.
"""

import collections
import re
import sys

EVENT = re.compile(
    r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>[\d.]+):\s+"
    r"(?P<event>[\w:]+):\s*(?P<fields>.*)$"
)
SWITCH = re.compile(r"prev_pid=(\d+) .*prev_state=(\S+) ==> .*next_pid=(\d+)")
WAKEUP = re.compile(r"\bpid=(\d+)")
OPENAT = "syscalls:sys_enter_openat"
RENAME = "syscalls:sys_enter_renameat2"
LINKED = "syscalls:sys_exit_linkat"
# The commit record's read and the two directory opens before the claim.
OPENS_BEFORE_CLAIM = 3


def read_events(path):
    events = []
    with open(path, errors="replace") as f:
        for line in f:
            m = EVENT.match(line)
            if m:
                events.append((float(m["t"]), int(m["tid"]), m["event"], m["fields"]))
    events.sort(key=lambda e: e[0])
    return events


def off_state(prev_state):
    if prev_state.startswith("R"):
        return "R"
    return "D" if "D" in prev_state else "S"


def timelines(events):
    """Per committing thread: (time, kind, detail) of its switches in and
    out, its wake-ups and its traced system calls."""
    committers = {tid for _, tid, event, _ in events if event == LINKED}
    lines = collections.defaultdict(list)
    for t, tid, event, fields in events:
        if event == "sched:sched_switch":
            m = SWITCH.search(fields)
            if not m:
                continue
            prev, state, nxt = int(m[1]), m[2], int(m[3])
            if prev in committers:
                lines[prev].append((t, "out", off_state(state)))
            if nxt in committers:
                lines[nxt].append((t, "in", None))
        elif event == "sched:sched_wakeup":
            m = WAKEUP.search(fields)
            if m and int(m[1]) in committers:
                lines[int(m[1])].append((t, "wake", None))
        elif tid in committers and event in (OPENAT, RENAME, LINKED):
            lines[tid].append((t, event, None))
    return lines


def split(line, start, end):
    """Seconds of [start, end] on a core, in the run queue, and blocked."""
    spent = collections.Counter()
    state, since, woke = "cpu", start, None

    def leave(t):
        if state == "cpu":
            spent["on a core"] += t - since
        elif state == "R":
            spent["run queue (preempted)"] += t - since
        else:
            w = min(woke, t) if woke is not None else t
            spent[f"blocked ({state})"] += max(0.0, w - since)
            spent["run queue (after a wake-up)"] += max(0.0, t - max(w, since))

    for t, kind, detail in line:
        if kind not in ("in", "out", "wake"):
            continue
        if t > end:
            break
        if kind == "wake":
            if state in ("D", "S"):
                woke = t
            continue
        if t >= start:
            leave(t)
            since = t
        state = "cpu" if kind == "in" else detail
        woke = None
    leave(end)
    return spent


def commits(lines):
    rows = []
    for line in lines.values():
        opens, claim, last_end = [], None, 0.0
        for t, kind, _ in line:
            if kind == OPENAT:
                opens.append(t)
            elif kind == RENAME:
                claim = t
            elif kind == LINKED and claim is not None:
                before = [o for o in opens if last_end < o <= claim]
                start = before[-OPENS_BEFORE_CLAIM] if len(before) >= OPENS_BEFORE_CLAIM else claim
                rows.append((t - start, split(line, start, t)))
                opens, claim, last_end = [], None, t
    rows.sort(key=lambda r: r[0])
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: commit_wait.py TRACE (the output of perf script; see the module docs)")
    rows = commits(timelines(read_events(sys.argv[1])))
    if not rows:
        sys.exit("no visible-first commit in the trace (no thread called linkat after renameat2)")
    n = len(rows)

    def ms(p):
        return rows[min(n - 1, int(p * n))][0] * 1e3

    print(f"{n} commits; first system call until the link: p50 {ms(0.5):.3f} ms, "
          f"p90 {ms(0.9):.3f} ms, max {rows[-1][0] * 1e3:.3f} ms")
    total = collections.Counter()
    for _, spent in rows:
        total.update(spent)
    print("all commits together: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in total.most_common()))
    print("the slowest commits (ms):")
    for length, spent in rows[::-1][:8]:
        print(f"  {length * 1e3:7.3f}: " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in spent.most_common()))


if __name__ == "__main__":
    main()
