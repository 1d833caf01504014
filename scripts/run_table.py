#!/usr/bin/env python3
"""Prints one table row per run directory, from summary.json and metrics.jsonl.

    scripts/run_table.py [--target 0.85] RUN_DIR [RUN_DIR ...]

Columns: the run's staleness bound, wall time, examples/s, time until the first
evaluation at or above the target test accuracy, final test accuracy, the workers' total
time blocked by the staleness bound, the largest clock lag and gradient staleness seen.
"""
import argparse
import json
import os
import sys


def row(run_dir, target):
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    start = None
    reached = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if start is None:
                start = m["time"]
            if m.get("kind") == "eval" and reached is None and m.get("test_accuracy", 0) >= target:
                reached = m["time"] - start
    return {
        "run": os.path.basename(os.path.normpath(run_dir)),
        "staleness": s.get("staleness"),
        "wall_s": s["wall_seconds"],
        "ex_per_s": s["examples_per_sec"],
        "to_target_s": reached,
        "test_acc": s["test_accuracy"],
        "wait_s": s.get("wait_seconds", 0.0),
        "max_lag": s.get("max_clock_lag_seen"),
        "max_stale": s.get("max_staleness_seen"),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    print(f"| run | staleness | wall s | examples/s | s to {a.target} | test acc | wait s | max lag | max staleness |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for d in a.runs:
        try:
            r = row(d, a.target)
        except (OSError, ValueError, KeyError) as e:
            print(f"run_table.py: {d}: {e}", file=sys.stderr)
            return 1
        t = "never" if r["to_target_s"] is None else f"{r['to_target_s']:.1f}"
        print(f"| {r['run']} | {r['staleness']} | {r['wall_s']:.1f} | {r['ex_per_s']:.0f} | {t} | "
              f"{r['test_acc']:.4f} | {r['wait_s']:.1f} | {r['max_lag']} | {r['max_stale']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
