#!/usr/bin/env python3
"""Prints one table row per run directory, from summary.json and metrics.jsonl.

    scripts/run_table.py [--target 0.85] [--scaling] RUN_DIR [RUN_DIR ...]

Columns: the run's staleness bound, wall time, examples/s, time until the first
evaluation at or above the target test accuracy, final test accuracy, the workers' total
time blocked by the staleness bound, the largest clock lag and gradient staleness seen.

--scaling (scripts/scaling_sweep.sh) prints one row per worker count and staleness bound
instead, over the runs (seeds) that share them: each run's test accuracy and their mean,
the mean examples/s and time to the target, the largest and mean gradient staleness, and
how the runs ended (summary.json status: ok, diverged, failed).
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
        "mean_stale": s.get("mean_staleness", 0.0),
        # The job's worker count (summary "workers" lists each worker's own figures).
        "workers": int(s.get("config", {}).get("num_workers", len(s.get("workers", [])))),
        "status": s.get("status"),
    }


def consistency(staleness):
    if staleness is None:
        return "?"
    return {0: "BSP", -1: "ASP"}.get(int(staleness), f"SSP {staleness}")


def mean(values):
    return sum(values) / len(values) if values else None


def print_scaling(rows, target):
    """One line per (workers, staleness) group: by worker count, then BSP, SSP, ASP."""
    groups = {}
    for r in rows:
        groups.setdefault((r["workers"], r["staleness"]), []).append(r)
    print(f"| workers | consistency | test acc (each run) | mean acc | examples/s | s to {target} "
          "| max / mean staleness | runs ended |")
    print("| ---: | --- | --- | ---: | ---: | ---: | --- | --- |")
    def order(key):  # ASP (-1) after every bound; an unknown bound last
        workers, staleness = key
        return (workers, 10**9 if staleness is None else 10**8 if int(staleness) < 0 else int(staleness))

    for (workers, staleness), g in sorted(groups.items(), key=lambda kv: order(kv[0])):
        accs = " / ".join(f"{r['test_acc']:.4f}" for r in g)
        reached = [r["to_target_s"] for r in g if r["to_target_s"] is not None]
        to_target = f"{mean(reached):.1f}" if len(reached) == len(g) else f"{len(reached)}/{len(g)} runs"
        ended = sorted({r["status"] for r in g})
        print(f"| {workers} | {consistency(staleness)} | {accs} | {mean([r['test_acc'] for r in g]):.4f} "
              f"| {mean([r['ex_per_s'] for r in g]):,.0f} | {to_target} "
              f"| {max(r['max_stale'] or 0 for r in g)} / {mean([r['mean_stale'] for r in g]):.2f} "
              f"| {', '.join(ended)} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--scaling", action="store_true", help="one row per worker count and staleness bound")
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    if a.scaling:
        rows = []
        for d in a.runs:
            try:
                rows.append(row(d, a.target))
            except (OSError, ValueError, KeyError) as e:
                # A run that never wrote its summary (a killed launcher) is named here and left
                # out of the table; failed and diverged runs have one and keep their row.
                print(f"run_table.py: {d}: {e}", file=sys.stderr)
        if not rows:
            return 1
        print_scaling(rows, a.target)
        return 0
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
