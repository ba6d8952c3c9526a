#!/usr/bin/env python3
"""Fails on broken internal links and includes of the book: every relative
link and image in book/src must name an existing file, every
{{#include path:anchor}} an existing file that has that anchor, and every
chapter of SUMMARY.md (drafts aside) must exist."""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "book", "src")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]*)\)")
INCLUDE = re.compile(r"\{\{#include ([^}:]+)(?::([A-Za-z0-9_-]+))?\}\}")

errors = []
for dirpath, _, files in os.walk(ROOT):
    for f in files:
        if not f.endswith(".md"):
            continue
        path = os.path.join(dirpath, f)
        text = open(path, encoding="utf-8").read()
        # Code blocks may show link-like text; links are checked outside them.
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(prose):
            if not target or re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue  # draft chapter, external link, or in-page anchor
            file_part = target.split("#")[0]
            if not os.path.exists(os.path.normpath(os.path.join(dirpath, file_part))):
                errors.append(f"{os.path.relpath(path, ROOT)}: broken link {target}")
        for inc, anchor in INCLUDE.findall(text):
            inc_path = os.path.normpath(os.path.join(dirpath, inc))
            if not os.path.exists(inc_path):
                errors.append(f"{os.path.relpath(path, ROOT)}: missing include {inc}")
            elif anchor and f"ANCHOR: {anchor}" not in open(inc_path, encoding="utf-8").read():
                errors.append(f"{os.path.relpath(path, ROOT)}: no anchor '{anchor}' in {inc}")

for e in errors:
    print(e)
print(f"book check: {len(errors)} problem(s)")
sys.exit(1 if errors else 0)
