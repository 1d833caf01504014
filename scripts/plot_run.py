#!/usr/bin/python3
"""Plots one or more run directories (metrics.jsonl and summary.json) as PNGs.

    scripts/plot_run.py [--out DIR] [--title TEXT] RUN_DIR [RUN_DIR ...]

Writes into DIR (default: plots/ inside the first run directory):
  accuracy.png    test accuracy against wall time and against examples processed
  loss.png        test loss (and training loss) against wall time and against examples
  throughput.png  examples/s of each worker against wall time, one panel per run
  staleness.png   the gradients' staleness distribution (servers' histograms)
  overview.png    the four views above side by side (what the README shows)

Several runs are overlaid; each is labelled with the job settings in which the runs
differ (e.g. staleness=0), or with its directory name when they differ in none.
Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3); nothing else.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Settings that say nothing about how a run trains: never used as labels.
IGNORED_KEYS = {"run_dir", "listen", "endpoint_file", "num_servers_registered"}


class Run:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        with open(os.path.join(path, "summary.json")) as f:
            self.summary = json.load(f)
        self.lines = []
        with open(os.path.join(path, "metrics.jsonl")) as f:
            for line in f:
                line = line.strip()
                if line:
                    self.lines.append(json.loads(line))
        self.config = self.summary.get("config", {})
        start = min((m["time"] for m in self.lines), default=0.0)
        # Train lines: time since start, cumulative examples (all workers).
        self.train = []
        total = 0
        for m in sorted((m for m in self.lines if m.get("kind") == "train"), key=lambda m: m["time"]):
            total += m.get("examples", 0)
            self.train.append((m["time"] - start, total, m))
        # Eval lines: time, examples processed by then, the line.
        self.evals = []
        for m in sorted((m for m in self.lines if m.get("kind") == "eval"), key=lambda m: m["time"]):
            t = m["time"] - start
            seen = max((n for (tt, n, _) in self.train if tt <= t), default=0)
            self.evals.append((t, seen, m))
        self.label = self.name

    def staleness_histogram(self):
        hist = []
        for s in self.summary.get("servers", []):
            h = s.get("staleness_histogram", [])
            if len(hist) < len(h):
                hist += [0] * (len(h) - len(hist))
            for i, c in enumerate(h):
                hist[i] += c
        while hist and hist[-1] == 0:
            hist.pop()
        return hist


def label_runs(runs):
    """Labels each run with the settings in which the runs differ."""
    if len(runs) < 2:
        return
    keys = sorted(set().union(*(r.config.keys() for r in runs)) - IGNORED_KEYS)
    differing = [k for k in keys if len({str(r.config.get(k)) for r in runs}) > 1]
    for r in runs:
        if differing:
            r.label = ", ".join(f"{k}={r.config.get(k)}" for k in differing)


def plot_metric(ax_time, ax_examples, runs, key, ylabel):
    for r in runs:
        pts = [(t, n, m[key]) for (t, n, m) in r.evals if key in m]
        if not pts:
            continue
        line, = ax_time.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", ms=3,
                             label=r.label)
        ax_examples.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", ms=3,
                         color=line.get_color(), label=r.label)
    ax_time.set_xlabel("wall time (s)")
    ax_examples.set_xlabel("examples processed")
    for ax in (ax_time, ax_examples):
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    ax_time.legend(fontsize=8)


def plot_throughput(ax, run, color_by_worker=True):
    workers = sorted({m.get("worker", 0) for (_, _, m) in run.train})
    for w in workers:
        pts = [(t, m.get("examples_per_sec", 0)) for (t, _, m) in run.train if m.get("worker", 0) == w]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=f"worker {w}", lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("examples/s")
    ax.set_title(run.label, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_staleness(ax, runs):
    """Bars per staleness value up to the runs' 99.5th percentile; the tail in one bar."""
    hists = [r.staleness_histogram() for r in runs]

    def percentile(hist, q):
        total, seen = sum(hist), 0
        for s, c in enumerate(hist):
            seen += c
            if total and seen >= q * total:
                return s
        return 0

    cut = max([4] + [percentile(h, 0.995) for h in hists if sum(h)])
    width = 0.8 / max(len(runs), 1)
    for i, (r, hist) in enumerate(zip(runs, hists)):
        total = sum(hist)
        if not total:
            continue
        shown = hist[: cut + 1] + [0] * (cut + 1 - len(hist[: cut + 1]))
        shown.append(sum(hist[cut + 1:]))
        xs = [s + (i - (len(runs) - 1) / 2) * width for s in range(len(shown))]
        mean = sum(s * c for s, c in enumerate(hist)) / total
        ax.bar(xs, [c / total for c in shown], width=width,
               label=f"{r.label} (mean {mean:.2f}, max {len(hist) - 1})")
    ax.set_xticks(range(cut + 2))
    ax.set_xticklabels([str(s) for s in range(cut + 1)] + [f">{cut}"], fontsize=8)
    ax.set_xlabel("gradient staleness (shard versions behind)")
    ax.set_ylabel("fraction of pushes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="output directory (default: RUN_DIR/plots of the first run)")
    p.add_argument("--title", default="", help="a title over overview.png")
    p.add_argument("runs", nargs="+")
    a = p.parse_args()
    runs = []
    for d in a.runs:
        try:
            runs.append(Run(d))
        except (OSError, ValueError, KeyError) as e:
            print(f"plot_run.py: {d}: not a finished run directory: {e}", file=sys.stderr)
            return 1
    label_runs(runs)
    out = a.out or os.path.join(a.runs[0], "plots")
    os.makedirs(out, exist_ok=True)
    written = []

    def save(fig, name):
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    plot_metric(a1, a2, runs, "test_accuracy", "test accuracy")
    save(fig, "accuracy.png")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    plot_metric(a1, a2, runs, "test_loss", "test loss")
    save(fig, "loss.png")

    fig, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 3.5), squeeze=False)
    for ax, r in zip(axes[0], runs):
        plot_throughput(ax, r)
    save(fig, "throughput.png")

    fig, ax = plt.subplots(figsize=(7, 4))
    plot_staleness(ax, runs)
    save(fig, "staleness.png")

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    plot_metric(axes[0][0], axes[0][1], runs, "test_accuracy", "test accuracy")
    # Throughput: the job's total examples/s over time, one line per run.
    ax = axes[1][0]
    for r in runs:
        if len(r.train) < 2:
            continue
        ts = [t for (t, _, _) in r.train]
        ns = [n for (_, n, _) in r.train]
        # Rate over a sliding window of ~5 s.
        xs, ys, j = [], [], 0
        for i in range(len(ts)):
            while ts[i] - ts[j] > 5:
                j += 1
            if ts[i] - ts[j] >= 2:  # shorter spans say more about report timing than speed
                xs.append(ts[i])
                ys.append((ns[i] - ns[j]) / (ts[i] - ts[j]))
        ax.plot(xs, ys, label=r.label, lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("job examples/s (5 s window)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    plot_staleness(axes[1][1], runs)
    if a.title:
        fig.suptitle(a.title)
    save(fig, "overview.png")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
