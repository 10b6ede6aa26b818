#!/usr/bin/env python3
"""Self instructions a request by source line and by file, from one callgrind dump made with
line tables and `--dump-instr=yes` (`LINES=1 benches/callgrind/measure`).

A function-level view puts everything inlined into a caller (an async handler's state machine
holds most of the request path) under that caller's name; lines say where it was written.

usage: lines.py DUMP N [--function SUBSTRING] [--top K] [--files K]
  DUMP      a worker thread's dump of one scenario (out-gateway/cg.PID.K-TID)
  N         the requests the dump holds (the measure's N)
"""
import argparse
import collections
import re

TABLE_REF = re.compile(r"\((\d+)\)(?: (.*))?")
# Paths shortened in the report: the registry's crate sources, the toolchain's, the project's.
SHORTEN = [
    (re.compile(r".*/registry/src/[^/]+/"), ""),
    (re.compile(r"^/rustc/[0-9a-f]+/library/"), "std: "),
]


def resolve(spec, table):
    """A name given as `(id) name` the first time and `(id)` after (callgrind's compression)."""
    m = TABLE_REF.match(spec)
    if not m:
        return spec
    if m.group(2):
        table[m.group(1)] = m.group(2)
    return table.get(m.group(1), "?")


def position(token, previous):
    """A position as callgrind writes it: absolute (hex or decimal), relative (+/-), or `*`."""
    if token == "*":
        return previous
    if token[0] in "+-":
        return previous + int(token)
    return int(token, 16) if token.startswith("0x") else int(token)


def self_costs(path, function=None):
    """Self `Ir` by (file, line) and by file, over functions whose name holds `function`."""
    files, fns = {}, {}
    file = sub = fn = None
    addr = line = 0
    after_calls = False
    by_line, by_file = collections.Counter(), collections.Counter()
    with open(path) as dump:
        for raw in dump:
            row = raw.rstrip("\n")
            if not row:
                continue
            if row.startswith("fl="):
                file = sub = resolve(row[3:], files)
            elif row.startswith(("fi=", "fe=")):
                sub = resolve(row[3:], files)
            elif row.startswith("fn="):
                fn, sub = resolve(row[3:], fns), file
            elif row.startswith("cfn="):
                resolve(row[4:], fns)
            elif row.startswith(("cfl=", "cfi=")):
                resolve(row[4:], files)
            elif row.startswith("calls="):
                after_calls = True
            elif row[0].isdigit() or row[0] in "+-*":
                cols = row.split()
                addr, line = position(cols[0], addr), position(cols[1], line)
                # The line after `calls=` is the callee's inclusive cost, not this line's own.
                if after_calls:
                    after_calls = False
                    continue
                if function and function not in (fn or ""):
                    continue
                cost = int(cols[2]) if len(cols) > 2 else 0
                by_line[(sub, line)] += cost
                by_file[sub] += cost
    return by_line, by_file


def short(path, root):
    path = (path or "?").replace(root, "")
    for pattern, replacement in SHORTEN:
        path = pattern.sub(replacement, path)
    return path


def main():
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("dump")
    args.add_argument("n", type=int)
    args.add_argument("--function", help="only functions whose name holds this")
    args.add_argument("--top", type=int, default=40, help="lines to show")
    args.add_argument("--files", type=int, default=30, help="files to show")
    args.add_argument("--root", default="", help="the project's path, left off its files")
    a = args.parse_args()
    by_line, by_file = self_costs(a.dump, a.function)
    total = sum(by_file.values()) / a.n
    print(f"self instructions a request: {total:,.0f}" + (f" in *{a.function}*" if a.function else ""))
    print("\nby line:")
    for (f, ln), v in by_line.most_common(a.top):
        print(f"{v / a.n:8.0f}  {short(f, a.root)}:{ln}")
    print("\nby file:")
    for f, v in by_file.most_common(a.files):
        print(f"{v / a.n:8.0f}  {short(f, a.root)}")


if __name__ == "__main__":
    main()
