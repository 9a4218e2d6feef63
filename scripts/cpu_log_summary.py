#!/usr/bin/env python3
"""Summarises the cpu.log of scripts/device_check.sh's cpu stage.

    /usr/bin/python3 scripts/cpu_log_summary.py device-out/cpu.log

Each "--- HEADER" line of the log names a measurement; "round N, " in it is
dropped, so that the rounds of one measurement come together. Printed, in the
log's order:
  - `seqpack bench --json` lines: ms per batch of each round and their median
    (with --profile's core parts: the median ms per call of the forward's and
    the backward's time loops and of the weight gradients);
  - the main job (`seqpack train --profile`): tokens/s of each round's last
    epoch and their median, with the median wall-clock seconds of its forward
    and backward (the profile's wall line) and of the recurrent core's time
    loops in each and of the backward's weight gradients (its rnn core line).
device_check.sh appends this to summary.md.
"""
import json
import re
import statistics
import sys

ROUND = re.compile(r"round \d+, ")
EPOCH = re.compile(r"^epoch (\d+)/(\d+): .*\((\d+) words/s, (\d+) tokens/s\)")
WALL = re.compile(r"^step profile \(wall s\): .*?, forward ([0-9.]+) .*?, backward ([0-9.]+) ")
CORE = re.compile(r"^rnn core profile \(wall s\): forward [0-9.]+: .*?, steps ([0-9.]+) .*?; "
                  r"backward [0-9.]+: .*?, steps ([0-9.]+) .*?, weights ([0-9.]+) ")


def summarise(lines):
    """Rows (header, kind, values, walls, core) in the order headers first appear."""
    order, bench, bench_core, main = [], {}, {}, {}
    header, wall, core = None, None, None
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("--- "):
            header = ROUND.sub("", line[4:])
            wall, core = None, None
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
            parts = record.get("core_sec_per_call")
            if isinstance(parts, dict):
                bench_core.setdefault(header, []).append(tuple(
                    1e3 * float(parts.get(k, 0.0))
                    for k in ("forward_steps", "backward_steps", "backward_weights")))
            continue
        m = WALL.match(line)
        if m:
            wall = (float(m.group(1)), float(m.group(2)))
            continue
        m = CORE.match(line)
        if m:
            core = tuple(float(m.group(i)) for i in (1, 2, 3))
            continue
        m = EPOCH.match(line)
        if m and m.group(1) == m.group(2):  # the run's last epoch
            if header not in bench and header not in main:
                order.append(header)
            main.setdefault(header, []).append((int(m.group(4)), wall, core))
    rows = []
    for h in order:
        if h in bench:
            rows.append((h, "ms", bench[h], None, medians(bench_core.get(h, []))))
        else:
            runs = main[h]
            rows.append((h, "tokens/s", [t for t, _, _ in runs], medians([w for _, w, _ in runs]),
                         medians([c for _, _, c in runs])))
    return rows


def medians(tuples):
    """Element-wise medians of the tuples that are there, or None."""
    present = [t for t in tuples if t is not None]
    if not present:
        return None
    return tuple(statistics.median(t[i] for t in present) for i in range(len(present[0])))


def render(rows):
    out = ["| measurement | unit | rounds | median | forward / backward wall s (median) "
           "| core: time loops forward / backward, weight gradients (median; main job s, "
           "bench ms per call) |",
           "| --- | --- | --- | ---: | --- | --- |"]
    for header, unit, values, extra, core in rows:
        if unit == "ms":
            rounds = ", ".join(f"{v:.3g}" for v in values)
            median = f"{statistics.median(values):.3g}"
        else:
            rounds = ", ".join(f"{v / 1e3:.0f}k" for v in values)
            median = f"{statistics.median(values) / 1e3:.0f}k"
        walls = f"{extra[0]:.3f} / {extra[1]:.3f}" if extra else ""
        if not core:
            steps = ""
        elif unit == "ms":
            steps = f"{core[0]:.3g} / {core[1]:.3g}, {core[2]:.3g}"
        else:
            steps = f"{core[0]:.3f} / {core[1]:.3f}, {core[2]:.3f}"
        out.append(f"| {header} | {unit} | {rounds} | {median} | {walls} | {steps} |")
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
