#!/usr/bin/env python3
"""One line per kernel of an `ncu --csv --page raw` report: the kernel name's tail and the given
metrics (default gpu__time_duration.sum and the SM active cycles min / avg / max), durations in us.
Other lines of the input (a program's own output) are skipped, except those matching --echo.
Usage: ncu ... --csv --page raw PROG | ncu_csv.py [--echo REGEX] [METRIC ...]   (or ncu_csv.py FILE ...)"""
import csv
import re
import sys

DEFAULT = ["gpu__time_duration.sum", "sm__cycles_active.min", "sm__cycles_active.avg", "sm__cycles_active.max"]


def main(argv):
    echo, src = None, sys.stdin
    if argv[:1] == ["--echo"]:
        echo, argv = re.compile(argv[1]), argv[2:]
    if argv and not argv[0].count("__"):  # a file name, not a metric
        src, argv = open(argv[0]), argv[1:]
    metrics = argv or DEFAULT
    lines = src.read().splitlines()
    for line in lines:
        if echo is not None and not line.startswith('"') and echo.search(line):
            print(line)
    rows = [r for r in csv.reader(l for l in lines if l.startswith('"')) if len(r) > 5]
    if not rows:
        print("  (no rows)")
        return
    h = rows[0]
    for r in rows[2:]:  # rows[1]: units
        d = dict(zip(h, r))
        out = [f"  {d.get('Kernel Name', '?').split('(')[0][-40:]:40s}"]
        for m in metrics:
            v = d.get(m)
            if v is None:
                out.append(f"{m}=?")
            elif m == "gpu__time_duration.sum":  # ns; ncu's csv writes 134,752
                out.append(f"dur {float(v.replace(',', '')) / 1000:9.1f} us")
            else:
                out.append(f"{m}={v}")
        print(" ".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
