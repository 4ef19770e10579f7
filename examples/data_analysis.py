#!/usr/bin/env python3
"""Data analysis in a sandbox: upload a CSV, compute quartiles with a Python script that runs
inside the sandbox, have it draw an SVG box plot by hand (no libraries), then download the plot.

    python3 examples/data_analysis.py [OUTPUT.svg]      (default ./boxplot.svg)

Config comes from the environment like the SDK: AIRLOCK_URL, AIRLOCK_API_KEY (or the admin.key
file). Exits 0 when the quartiles match the ones computed here and the SVG looks right.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
from typing import Dict, List

try:
    from airlock import Sandbox
except ImportError:  # run from a checkout without installing the SDK
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk",
                                    "python"))
    from airlock import Sandbox

# Runs inside the sandbox: reads the CSV, prints the quartiles per column as JSON, writes an SVG.
ANALYSIS = r'''
import csv, json, sys

def quartiles(xs):
    xs = sorted(xs)
    def q(p):  # linear interpolation between closest ranks
        pos = (len(xs) - 1) * p
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return {"min": xs[0], "q1": q(0.25), "median": q(0.5), "q3": q(0.75), "max": xs[-1]}

with open(sys.argv[1], newline="") as f:
    rows = list(csv.DictReader(f))
columns = list(rows[0].keys())
stats = {c: quartiles([float(r[c]) for r in rows]) for c in columns}

lo = min(s["min"] for s in stats.values())
hi = max(s["max"] for s in stats.values())
W, H, PAD, BOX = 120 * len(columns) + 80, 400, 40, 50
def y(v):
    return H - PAD - (v - lo) / ((hi - lo) or 1) * (H - 2 * PAD)
parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
         f'<text x="4" y="{y(hi):.1f}">{hi:g}</text>', f'<text x="4" y="{y(lo):.1f}">{lo:g}</text>']
for i, c in enumerate(columns):
    s = stats[c]
    cx = PAD + 80 + i * 120
    parts += [
        f'<line x1="{cx}" y1="{y(s["min"]):.1f}" x2="{cx}" y2="{y(s["max"]):.1f}" stroke="black"/>',
        f'<rect x="{cx - BOX / 2}" y="{y(s["q3"]):.1f}" width="{BOX}" '
        f'height="{y(s["q1"]) - y(s["q3"]):.1f}" fill="#9cc3e6" stroke="black"/>',
        f'<line x1="{cx - BOX / 2}" y1="{y(s["median"]):.1f}" x2="{cx + BOX / 2}" '
        f'y2="{y(s["median"]):.1f}" stroke="#c00" stroke-width="2"/>',
        f'<text x="{cx}" y="{H - 12}" text-anchor="middle">{c}</text>',
    ]
parts.append("</svg>")
with open(sys.argv[2], "w") as f:
    f.write("\n".join(parts) + "\n")
print(json.dumps(stats))
'''


def make_csv() -> Dict[str, List[float]]:
    rng = random.Random(7)
    return {
        "latency_ms": [round(rng.lognormvariate(3, 0.4), 2) for _ in range(200)],
        "cpu_pct": [round(rng.uniform(5, 95), 2) for _ in range(200)],
        "queue_len": [float(rng.randint(0, 40)) for _ in range(200)],
    }


def main() -> int:
    out_path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "boxplot.svg")
    data = make_csv()
    columns = list(data)
    lines = [",".join(columns)] + [
        ",".join(str(data[c][i]) for c in columns) for i in range(len(data[columns[0]]))]
    csv_bytes = ("\n".join(lines) + "\n").encode()

    with Sandbox.create(template="base", ttl_seconds=600,
                        metadata={"example": "data_analysis"}) as sbx:
        print(f"sandbox {sbx.id}")
        sbx.files.write("/home/user/data.csv", csv_bytes)
        sbx.files.write("/home/user/analyze.py", ANALYSIS)
        print(f"uploaded data.csv ({len(csv_bytes)} bytes, {len(lines) - 1} rows)")
        r = sbx.exec(["python3", "analyze.py", "data.csv", "out.svg"], timeout_seconds=60)
        if r.exit_code != 0:
            print(f"analysis failed (exit {r.exit_code}):\n{r.stderr}")
            return 1
        stats = json.loads(r.stdout)
        svg = sbx.files.read("/home/user/out.svg")

    ok = True
    print(f"{'column':<12} {'min':>8} {'q1':>8} {'median':>8} {'q3':>8} {'max':>8}")
    for c in columns:
        s = stats[c]
        print(f"{c:<12} " + " ".join(f"{s[k]:>8.2f}" for k in ("min", "q1", "median", "q3", "max")))
        expected = statistics.quantiles(data[c], n=4, method="inclusive")
        got = [s["q1"], s["median"], s["q3"]]
        if any(abs(a - b) > 1e-9 for a, b in zip(got, expected)):
            print(f"  MISMATCH for {c}: sandbox {got}, local {expected}")
            ok = False
    text = svg.decode()
    if not (text.startswith("<svg") and text.count("<rect") == len(columns) + 1
            and all(c in text for c in columns)):
        print("the SVG does not look like a box plot")
        ok = False
    with open(out_path, "wb") as f:
        f.write(svg)
    print(f"box plot: {out_path} ({len(svg)} bytes)")
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
