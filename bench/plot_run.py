#!/usr/bin/env python3
"""Draws bench/run's chart from the JSON airlock-bench-run wrote.

    bench/plot_run.py RUN_JSON OUT_PNG

Three panels: p50 latency of each operation (whisker up to p99) beside bwrap and runsc, log
scale; lifecycles per second at each concurrency; host memory per idle sandbox. Targets are
drawn as dashed lines. A side that was not measured (tool absent, route not available) is left
out and named in the legend.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file only
import matplotlib.pyplot as plt  # noqa: E402

SIDES = [("airlock", "#1f6feb"), ("bwrap", "#8c8c8c"), ("runsc", "#d97706")]


def summary_ms(side):
    """(p50, p99) in ms, or None when the side has no measurement."""
    s = side.get("summary")
    if side.get("status") != "ok" or not s or s["n"] == 0:
        return None
    return s["p50_us"] / 1000, s["p99_us"] / 1000


def status_note(rows, name):
    """'bwrap: absent' style notes for sides that were not measured anywhere."""
    statuses = {r[name]["status"] for r in rows if r[name]["status"] != "ok"}
    measured = any(r[name]["status"] == "ok" for r in rows)
    if measured or not statuses:
        return ""
    return f" ({', '.join(sorted(statuses))})"


def latency_panel(ax, rows):
    width = 0.27
    for k, (name, color) in enumerate(SIDES):
        xs, p50s, errs = [], [], []
        for i, row in enumerate(rows):
            m = summary_ms(row[name])
            if m is None:
                continue
            xs.append(i + (k - 1) * width)
            p50s.append(m[0])
            errs.append(max(m[1] - m[0], 0))
        label = name + status_note(rows, name)
        ax.bar(xs, p50s, width, color=color, label=label,
               yerr=[[0] * len(errs), errs], capsize=2, error_kw={"elinewidth": 0.8})
    for i, row in enumerate(rows):
        if row["airlock"]["status"] == "not available":
            # x in data, y in axes fraction: the log scale has no 0 to stand on.
            ax.text(i - width, 0.02, "not available", transform=ax.get_xaxis_transform(),
                    rotation=90, fontsize=7, va="bottom", ha="center", color="#1f6feb")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["op"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (bar p50, whisker p99)")
    ax.set_title("latency, same run")
    for row in rows:
        if row["op"] == "warm create":
            ax.axhline(3, color="#1f6feb", ls="--", lw=0.8, label="warm create p50 target, 3 ms")
    ax.legend(fontsize=8)


def throughput_panel(ax, rows):
    levels = [r for r in rows if r["op"].startswith("lifecycle")]
    width = 0.27
    for k, (name, color) in enumerate(SIDES):
        xs, values = [], []
        for i, row in enumerate(levels):
            if row[name]["status"] == "ok" and "per_s" in row[name]:
                xs.append(i + (k - 1) * width)
                values.append(row[name]["per_s"])
        ax.bar(xs, values, width, color=color, label=name)
    ax.axhline(100, color="#1f6feb", ls="--", lw=0.8)
    ax.text(-0.4, 100, "target 100/s", fontsize=7, va="bottom", color="#1f6feb")
    ax.set_xticks(range(len(levels)))
    ax.set_xticklabels([r["op"].replace("lifecycle c", "concurrency ") for r in levels],
                       fontsize=8)
    ax.set_ylabel("lifecycles / s")
    ax.set_title("create + exec + destroy")
    ax.legend(fontsize=8)


def density_panel(ax, density):
    colors = dict(SIDES)
    names = [d["engine"] for d in density]
    # What the target is judged on: the larger of MemAvailable's fall and the accounted memory.
    values = [max(d.get("judged_mib_each", d["host_mib_each"]), 0) for d in density]
    bars = ax.bar(range(len(density)), values, 0.6, color=[colors.get(n, "#444") for n in names])
    for bar, d, value in zip(bars, density, values):
        ax.annotate(f"{value:.2f} MiB\n{d['created']} idle", (bar.get_x() +
                    bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                    textcoords="offset points", ha="center", fontsize=7)
    ax.axhline(2, color="#1f6feb", ls="--", lw=0.8)
    ax.text(len(density) - 0.6, 2, "target 2 MiB", fontsize=7, ha="right", va="bottom",
            color="#1f6feb")
    ax.set_xticks(range(len(density)))
    ax.set_xticklabels(names, fontsize=8)
    if values and max(values) > 20:
        ax.set_yscale("log")
    ax.set_ylabel("host MiB per idle sandbox")
    ax.set_title("density")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_run.py RUN_JSON OUT_PNG")
    with open(sys.argv[1]) as f:
        doc = json.load(f)
    rows = doc["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5),
                             gridspec_kw={"width_ratios": [2.4, 1.3, 1]})
    latency_panel(axes[0], rows)
    throughput_panel(axes[1], rows)
    density_panel(axes[2], doc.get("density", []))
    m = doc["machine"]
    fig.suptitle(f"bench/run{' --quick' if doc['quick'] else ''}: {m['cpus']} cpus, "
                 f"Linux {m['kernel']}, load {m['load_before']} before, {m['load_after']} after",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"chart: {sys.argv[2]}")


if __name__ == "__main__":
    main()
