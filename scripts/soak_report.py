#!/usr/bin/env python3
"""The report of a soak run (scripts/soak.sh RUN_DIR): what was killed, pushes lost,
rollbacks, recovery times (p50/p99) and each job's test accuracy against the job without
faults.

    scripts/soak_report.py RUN_DIR [SECONDS]

Reads RUN_DIR/kills.tsv, RUN_DIR/job-*/summary.json, RUN_DIR/clean/summary.json and the
servers' logs. Kills are matched to the failures the coordinator recorded by process id. A
backup copy that refused a request its primary forwarded (or saw a gap in them) has drifted
from its primary, which only shows when it is promoted: the servers log it, and it counts
here. Exit status 0 when every faulted job ended ok with pushes_lost 0, no rollback, no
shard with two copies down at once and no drifted copy; 1 otherwise.
"""
import csv
import json
import math
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def spread(values):
    if not values:
        return "-"
    return "p50 %.2f s, p99 %.2f s (n=%d)" % (percentile(values, 50), percentile(values, 99),
                                              len(values))


def main():
    run_dir = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else None
    with open(os.path.join(run_dir, "kills.tsv")) as f:
        kills = list(csv.DictReader(f, delimiter="\t"))
    jobs = sorted((d for d in os.listdir(run_dir) if re.fullmatch(r"job-\d+", d)),
                  key=lambda d: int(d.split("-")[1]))
    summaries = {j: load(os.path.join(run_dir, j, "summary.json")) for j in jobs}
    clean = load(os.path.join(run_dir, "clean", "summary.json"))

    done = [k for k in kills if k["kind"] != "skip"]
    counts = {}
    for k in done:
        key = "%s (%s)" % (k["kind"], "kill -9" if k["signal"] == "KILL" else "SIGTERM")
        counts[key] = counts.get(key, 0) + 1
    print("soak: %d jobs, %d kills%s" % (len(jobs), len(done),
          " in %.1f min" % (seconds / 60) if seconds else ""))
    for key in sorted(counts):
        print("  %-24s %d" % (key, counts[key]))
    print("  %-24s %d" % ("skipped (a copy down)", len(kills) - len(done)))

    detect, failover, whole, coord_down, unmatched = [], [], [], [], 0
    overlaps = 0
    for j in jobs:
        s = summaries[j] or {}
        failures = s.get("failures", [])
        coord_down += [f["down_seconds"] for f in failures
                       if f.get("kind") == "coordinator_restart" and "down_seconds" in f]
        copies_down = []  # (from, to) of each server's single-copy window
        for k in (k for k in done if k["job"] == j and k["kind"] in ("worker", "server")):
            t, pid = float(k["unix_time"]), int(k["pid"])
            match = [f for f in failures if f.get("pid") == pid and
                     f.get("kind", "").startswith(k["kind"])]
            if not match:
                unmatched += 1  # e.g. the job ended before the death was noticed
                continue
            f = match[0]
            if k["kind"] == "worker":
                detect.append(f.get("unix_time", t) - t)
                continue
            if "promoted_unix_time" in f:
                failover.append(f["promoted_unix_time"] - t)
            if "rereplicated_unix_time" in f:
                whole.append(f["rereplicated_unix_time"] - t)
                copies_down.append((t, f["rereplicated_unix_time"]))
            else:
                copies_down.append((t, float("inf")))
        copies_down.sort()
        overlaps += sum(1 for a, b in zip(copies_down, copies_down[1:]) if b[0] < a[1])
    print("recovery:")
    print("  worker death noticed (kill -> declared)      %s" % spread(detect))
    print("  server failover (kill -> backup promoted)    %s" % spread(failover))
    print("  two copies again (kill -> re-replicated)     %s" % spread(whole))
    print("  coordinator down (journal -> resumed)        %s" % spread(coord_down))
    if unmatched:
        print("  %d kills without a recorded failure (the job ended first)" % unmatched)

    ok = True
    print("%-8s %-8s %-9s %-8s %-11s %-11s %-9s" % ("job", "status", "test_acc", "vs clean",
                                                  "pushes_lost", "rolled_back", "failures"))
    accs = []
    clean_acc = (clean or {}).get("test_accuracy")
    for j in jobs:
        s = summaries[j] or {"status": "missing"}
        acc = s.get("test_accuracy")
        diff = "%+.2f pt" % (100 * (acc - clean_acc)) if acc is not None and clean_acc else "-"
        if acc is not None:
            accs.append(acc)
        print("%-8s %-8s %-9s %-8s %-11s %-11s %-9d" % (
            j, s.get("status"), "%.4f" % acc if acc is not None else "-", diff,
            s.get("pushes_lost"), s.get("pushes_rolled_back"), len(s.get("failures", []))))
        ok = ok and s.get("status") == "ok" and s.get("pushes_lost") == 0 and \
            not s.get("pushes_rolled_back")
    print("%-8s %-8s %-9s" % ("clean", (clean or {}).get("status"),
                              "%.4f" % clean_acc if clean_acc is not None else "-"))
    if accs and clean_acc is not None:
        mean = sum(accs) / len(accs)
        print("mean test accuracy with faults %.4f, without %.4f (%+.2f points)"
              % (mean, clean_acc, 100 * (mean - clean_acc)))
    print("shards with both copies down at once: %d" % overlaps)
    drifted = []
    for j in jobs:
        logs = os.path.join(run_dir, j, "logs")
        for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
            if not name.startswith("server-"):
                continue
            with open(os.path.join(logs, name), errors="replace") as f:
                if any("refused a forwarded request" in line or "got forward" in line
                       for line in f):
                    drifted.append("%s/%s" % (j, name))
    print("backup copies that drifted from their primary: %d%s"
          % (len(drifted), " (" + ", ".join(drifted) + ")" if drifted else ""))
    ok = ok and overlaps == 0 and not drifted
    print("soak: %s" % ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
