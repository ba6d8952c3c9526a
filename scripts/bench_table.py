#!/usr/bin/env python3
"""Turns the JSON written by `ringmail-benches --json` into the markdown
tables of the book's performance chapter, so figures are never retyped.
With --charts DIR it links the charts that `ringmail-benches report
BENCH.json DIR` drew there (plotters): one bar chart per comparison, and the
latency-percentile curves of msg-lat; a missing chart is an error.

usage: bench_table.py BENCH.json [--charts DIR]   (DIR relative to the
markdown's directory, e.g. book/src/ops/charts -> links "charts/...")"""
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


def link(out, charts, name, alt):
    if not os.path.exists(os.path.join(charts, name)):
        sys.exit(f"bench_table: {name} is missing in {charts} (run `ringmail-benches report` first)")
    out.append(f"![{alt}]({os.path.basename(os.path.normpath(charts))}/{name})")
    out.append("")


def main(path, charts=None):
    doc = json.load(open(path))
    mode = "quick" if doc.get("quick") else "full"
    when = f", measured {doc['date']}" if doc.get("date") else ""
    out = [f"*{doc['machine']}{when}; {mode} mode, {doc['rounds']} rounds.*", ""]
    for c in doc["comparisons"]:
        better = "higher is better" if c["better"] == "Higher" else "lower is better"
        out.append(f"**{c['name']}** ({c['unit']}, {better})")
        out.append("")
        if charts:
            link(out, charts, slug(c["name"]) + ".svg", c["name"])
            m = re.match(r"msg-lat (\d+) msg/s, (\w+) p50", c["name"])
            if m:
                rate, side = m.groups()
                link(out, charts, f"msg-lat-{rate}-{side}-percentiles.svg",
                     f"msg-lat {rate} msg/s, {side} latency by percentile")
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
