#!/usr/bin/env python3
"""Checks the actor crate's layering (ARCHITECTURE.md, "Layers"):

* nothing under actors/src/runtime/ refers to the typed API (`crate::actor`)
  or to anything built above the runtime (system, supervisor, net, remote);
* module imports form no cycle, except among the files of actors/src/actor/.

A module's dependencies are the sibling or crate modules its code names
(`use super::x`, `super::x::`, `crate::a::b`), comments excluded. Exits 1
and names the offending files or the cycle.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "actors" / "src"
ABOVE_RUNTIME = ("actor", "system", "supervisor", "net", "remote")


def module_of(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def code_of(path):
    lines = []
    for line in path.read_text().splitlines():
        s = line.strip()
        if s.startswith("//"):
            continue
        lines.append(line.split("//")[0] if "//" in line and '"' not in line else line)
    return "\n".join(lines)


def main():
    files = sorted(ROOT.rglob("*.rs"))
    mods = {module_of(f): f for f in files}
    errors = []
    deps = {m: set() for m in mods}
    for m, f in mods.items():
        code = code_of(f)
        names = set()
        for hit in re.finditer(r"\bcrate::((?:\w+::)*\w+)", code):
            names.add(tuple(hit.group(1).split("::")))
        base = m[:-1]  # what `super` names, from a file or a mod.rs alike
        for hit in re.finditer(r"\bsuper::((?:\w+::)*\w+)", code):
            names.add(base + tuple(hit.group(1).split("::")))
        # `use super::{a, b::c}` groups
        for hit in re.finditer(r"\buse (crate|super)::\{([^;]*)\};", code, re.S):
            prefix = () if hit.group(1) == "crate" else base
            for item in re.split(r",\s*", hit.group(2)):
                item = item.strip()
                if item:
                    names.add(prefix + tuple(re.split(r"::", item.split("{")[0].strip(":"))))
        for n in names:
            # the longest known module that prefixes the name
            for k in range(len(n), 0, -1):
                if n[:k] in mods and n[:k] != m:
                    if not (m[:len(n[:k])] == n[:k]):  # not one's own ancestor
                        deps[m].add(n[:k])
                    break
        if m[:1] == ("runtime",):
            for target in deps[m]:
                if target[:1] and target[0] in ABOVE_RUNTIME:
                    errors.append(f"{f.relative_to(ROOT.parent.parent)}: the runtime imports {'::'.join(target)}")
    # cycles (Tarjan), allowed only inside actor/
    index, low, stack, on, sccs = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(comp)

    sys.setrecursionlimit(10000)
    for v in deps:
        if v not in index:
            strong(v)
    for comp in sccs:
        if len(comp) > 1 and not all(c[:1] == ("actor",) for c in comp):
            names = ", ".join(sorted("::".join(c) or "crate" for c in comp))
            errors.append(f"import cycle outside actor/: {names}")
    if "-v" in sys.argv:
        for m in sorted(deps):
            print("::".join(m) or "crate", "->", ", ".join(sorted("::".join(d) for d in deps[m])))
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"layers ok: {len(mods)} modules, runtime imports nothing above it, "
          "no import cycle outside actor/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
