#!/usr/bin/env python3
"""Turns the JSON written by `ringmail-benches --json` into the markdown
tables of the book's performance chapter, and (with --charts DIR) one SVG bar
chart per comparison in DIR, linked from the tables, so figures are never
retyped.

usage: bench_table.py BENCH.json [--charts DIR]   (DIR relative to the
markdown's directory, e.g. book/src/ops/charts -> links "charts/...")"""
import html
import json
import os
import re
import sys


def fmt(v, unit):
    if unit in ("msg/s", "msgs/s", "fds/s", "req/s", "actors/s"):
        return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"
    if unit == "ns":
        return f"{v / 1e3:.1f} µs" if v >= 1000 else f"{v:.0f} ns"
    return f"{v:.1f}"


def slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def chart(c, path):
    """A horizontal bar chart of the medians; Ringmail's bar is dark."""
    rows = c["rows"]
    top = max(r["median"] for r in rows) or 1.0
    bar_w, left, h = 360, 150, 22
    height = 30 + h * len(rows) + 10
    better = "higher is better" if c["better"] == "Higher" else "lower is better"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + bar_w + 120}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<text x="4" y="16" font-weight="bold">{html.escape(c["name"])} '
        f'({html.escape(c["unit"])}, {better})</text>',
    ]
    for i, r in enumerate(rows):
        y = 28 + i * h
        w = max(1.0, bar_w * r["median"] / top)
        fill = "#2b4c7e" if i == 0 else "#9db4d6"
        out.append(f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{html.escape(r["system"])}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{w:.1f}" height="{h - 6}" fill="{fill}"/>')
        out.append(
            f'<text x="{left + w + 6:.1f}" y="{y + 14}">{html.escape(fmt(r["median"], c["unit"]))} '
            f'(x{r["ratio_to_ringmail"]:.2f})</text>'
        )
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def main(path, charts=None):
    doc = json.load(open(path))
    mode = "quick" if doc.get("quick") else "full"
    out = [f"*{doc['machine']}; {mode} mode, {doc['rounds']} rounds.*", ""]
    for c in doc["comparisons"]:
        better = "higher is better" if c["better"] == "Higher" else "lower is better"
        out.append(f"**{c['name']}** ({c['unit']}, {better})")
        out.append("")
        if charts:
            os.makedirs(charts, exist_ok=True)
            name = slug(c["name"]) + ".svg"
            chart(c, os.path.join(charts, name))
            out.append(f"![{c['name']}]({os.path.basename(os.path.normpath(charts))}/{name})")
            out.append("")
        out.append("| system | median | ratio to ringmail |")
        out.append("| --- | ---: | ---: |")
        for r in c["rows"]:
            out.append(f"| {r['system']} | {fmt(r['median'], c['unit'])} | {r['ratio_to_ringmail']:.3f} |")
        out.append("")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    args = sys.argv[1:]
    charts = None
    if "--charts" in args:
        i = args.index("--charts")
        charts = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1:
        sys.exit("usage: bench_table.py BENCH.json [--charts DIR]")
    main(args[0], charts)
