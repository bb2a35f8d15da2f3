#!/usr/bin/env python3
# Checks what the compiler does not: no line of Swift under Sources/ is longer than 150
# columns (docs/ARCHITECTURE.md, "Conventions"). Prints each one and exits 1 if any.
import os
import sys

LIMIT = 150
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
long_lines = []
for directory, _, files in os.walk(os.path.join(root, "Sources")):
    for name in sorted(files):
        if not name.endswith(".swift"):
            continue
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as source:
            for number, line in enumerate(source, 1):
                if len(line.rstrip("\n")) > LIMIT:
                    long_lines.append(f"{os.path.relpath(path, root)}:{number}: {len(line.rstrip())} columns")
for line in long_lines:
    print(line)
print(f"sources: {len(long_lines)} line(s) over {LIMIT} columns")
sys.exit(1 if long_lines else 0)
