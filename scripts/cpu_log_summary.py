#!/usr/bin/env python3
"""Summarises the cpu.log of scripts/device_check.sh's cpu stage.

    /usr/bin/python3 scripts/cpu_log_summary.py device-out/cpu.log

Each "--- HEADER" line of the log names a measurement; "round N, " in it is
dropped, so that the rounds of one measurement come together. Printed, in the
log's order:
  - `seqpack bench --json` lines: ms per batch of each round and their median;
  - the main job (`seqpack train --profile`): tokens/s of each round's last
    epoch and their median, with the median wall-clock seconds of its forward
    and backward (the profile's wall line).
device_check.sh appends this to summary.md.
"""
import json
import re
import statistics
import sys

ROUND = re.compile(r"round \d+, ")
EPOCH = re.compile(r"^epoch (\d+)/(\d+): .*\((\d+) words/s, (\d+) tokens/s\)")
WALL = re.compile(r"^step profile \(wall s\): .*?, forward ([0-9.]+) .*?, backward ([0-9.]+) ")


def summarise(lines):
    """Rows (header, kind, values, extra) in the order headers first appear."""
    order, bench, main = [], {}, {}
    header, wall = None, None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("--- "):
            header = ROUND.sub("", line[4:])
            wall = None
            continue
        if header is None:
            continue
        if line.startswith('{"impl"'):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if header not in bench and header not in main:
                order.append(header)
            bench.setdefault(header, []).append(1e3 * float(record["sec_per_batch"]))
            continue
        m = WALL.match(line)
        if m:
            wall = (float(m.group(1)), float(m.group(2)))
            continue
        m = EPOCH.match(line)
        if m and m.group(1) == m.group(2):  # the run's last epoch
            if header not in bench and header not in main:
                order.append(header)
            main.setdefault(header, []).append((int(m.group(4)), wall))
    rows = []
    for h in order:
        if h in bench:
            rows.append((h, "ms", bench[h], None))
        else:
            runs = main[h]
            walls = [w for _, w in runs if w is not None]
            extra = None
            if walls:
                extra = (statistics.median(w[0] for w in walls), statistics.median(w[1] for w in walls))
            rows.append((h, "tokens/s", [t for t, _ in runs], extra))
    return rows


def render(rows):
    out = ["| measurement | unit | rounds | median | forward / backward wall s (median) |",
           "| --- | --- | --- | ---: | --- |"]
    for header, unit, values, extra in rows:
        if unit == "ms":
            rounds = ", ".join(f"{v:.3g}" for v in values)
            median = f"{statistics.median(values):.3g}"
        else:
            rounds = ", ".join(f"{v / 1e3:.0f}k" for v in values)
            median = f"{statistics.median(values) / 1e3:.0f}k"
        walls = f"{extra[0]:.3f} / {extra[1]:.3f}" if extra else ""
        out.append(f"| {header} | {unit} | {rounds} | {median} | {walls} |")
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print("usage: cpu_log_summary.py CPU_LOG", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8", errors="replace") as f:
            rows = summarise(f)
    except OSError as e:
        print(f"cpu_log_summary: {argv[1]}: {e.strerror}", file=sys.stderr)
        return 1
    print(render(rows) if rows else "(no measurements in the log)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
