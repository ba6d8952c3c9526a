#!/usr/bin/env python3
"""Turns the JSON written by `ringmail-benches --json` into the markdown
tables of the book's performance chapter (so figures are never retyped)."""
import json
import sys


def fmt(v, unit):
    if unit in ("msg/s", "msgs/s", "fds/s", "req/s", "actors/s"):
        return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"
    if unit == "ns":
        return f"{v / 1e3:.1f} µs" if v >= 1000 else f"{v:.0f} ns"
    return f"{v:.1f}"


def main(path):
    doc = json.load(open(path))
    mode = "quick" if doc.get("quick") else "full"
    out = [f"*{doc['machine']}; {mode} mode, {doc['rounds']} rounds.*", ""]
    for c in doc["comparisons"]:
        better = "higher is better" if c["better"] == "Higher" else "lower is better"
        out.append(f"**{c['name']}** ({c['unit']}, {better})")
        out.append("")
        out.append("| system | median | ratio to ringmail |")
        out.append("| --- | ---: | ---: |")
        for r in c["rows"]:
            out.append(f"| {r['system']} | {fmt(r['median'], c['unit'])} | {r['ratio_to_ringmail']:.3f} |")
        out.append("")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_table.py BENCH.json")
    main(sys.argv[1])
