"""Where a scenario's instructions go: callgrind's self cost per function, over every thread,
grouped by component (the crate, or the gateway's own module), per request.

    components.py DIR DUMP BASE N [TOP [BASE_REQUESTS]]
DUMP, BASE: dump numbers (`cg.<pid>.<number>-<thread>`); TOP: also list that many functions;
BASE_REQUESTS: the requests in the base dump (default 1; 0 for an idle stretch).
"""
import collections
import glob
import re
import sys

GATEWAY = ("drg_gateway::", "domain_risk_gateway::")
SPLIT = ("mx", "access", "account", "edge", "data", "domain")


def component(function):
    name = re.sub(r"^[<&*]+|^(dyn |mut |impl )", "", function)
    for prefix in GATEWAY:
        if name.startswith(prefix):
            parts = name[len(prefix):].split("::")
            depth = 2 if parts[0] in SPLIT and len(parts) > 2 else 1
            return "gateway::" + "::".join(parts[:depth])
    if "::" not in name:  # C: the allocator, memcpy, SQLite
        if name.startswith("sqlite3"):
            return "sqlite (C)"
        if name.startswith(("mi_", "_mi_")):
            return "mimalloc (C)"
        return "libc/other C"
    crate = name.split("::", 1)[0]
    return {"std": "rust std", "core": "rust std", "alloc": "rust std"}.get(crate, crate)


def self_costs(path, out):
    """Adds the self cost of each function in one callgrind file to `out`."""
    names, current, after_calls = {}, None, False
    # A cost line starts with one position (the line) or, dumped with `--dump-instr=yes`
    # (LINES=1), two (the instruction's address, then the line); the cost follows them.
    positions = 1

    def resolve(spec):
        m = re.match(r"\((\d+)\)(?: (.*))?", spec)
        if not m:
            return spec
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
            elif line.startswith("fn="):
                current = resolve(line[3:])
            elif line.startswith("cfn="):
                resolve(line[4:])
            elif line.startswith("calls="):
                after_calls = True
            elif line[:1].isdigit() or line[:1] in "+-*":
                if after_calls:  # the call's inclusive cost: not this function's own
                    after_calls = False
                    continue
                parts = line.split()
                if len(parts) > positions and current:
                    out[current] += int(parts[positions])


def costs(d, number):
    out = collections.Counter()
    for f in glob.glob(f"{d}/cg.*.{number}-*"):
        self_costs(f, out)
    return out


def main():
    d, dump, base, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    base_requests = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    run, idle = costs(d, dump), costs(d, base)
    per_fn = {f: (c - idle.get(f, 0)) / (n - base_requests) for f, c in run.items()}
    total = sum(per_fn.values())
    groups = collections.Counter()
    for f, c in per_fn.items():
        groups[component(f)] += c
    print(f"{'component (self cost)':40} {'instr/req':>10} {'share':>7}")
    for name, c in groups.most_common():
        if c / max(total, 1) >= 0.005:
            print(f"{name:40} {c:10.0f} {c / max(total, 1):7.1%}")
    print(f"{'all':40} {total:10.0f}")
    if top:
        print(f"\nthe {top} costliest functions:")
        for f, c in sorted(per_fn.items(), key=lambda kv: -kv[1])[:top]:
            print(f"{c:10.0f}  {f[:150]}")


if __name__ == "__main__":
    main()
