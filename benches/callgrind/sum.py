"""Instructions per request from callgrind's dumps (one file per thread and dump).

    sum.py DIR N [NAMES BASE [BASE_REQUESTS]]
NAMES: the dumps' names in order, comma-separated (default lookup,unauth,top,lookup0,check);
BASE: the dump subtracted from each (default lookup0, one request); BASE_REQUESTS: the requests
in it (default 1; 0 for an idle stretch). BASE `@idle`: each dump X less the dump `idle-X`, an
idle stretch as long as X (background services' timers are not a request's cost)."""
import glob, sys
d = sys.argv[1]; n = int(sys.argv[2])
order = (sys.argv[3] if len(sys.argv) > 3 else "lookup,unauth,top,lookup0,check").split(",")
base_name = sys.argv[4] if len(sys.argv) > 4 else "lookup0"
base_requests = int(sys.argv[5]) if len(sys.argv) > 5 else 1
names = {k + 1: name for k, name in enumerate(order)}
res = {}
for k, name in names.items():
    per = {}
    for f in glob.glob(f"{d}/cg.*.{k}-*"):
        tid = f.rsplit("-", 1)[1]
        for line in open(f):
            if line.startswith("summary:") or line.startswith("totals:"):
                per[tid] = int(line.split()[1]); break
    res[name] = per
paired = base_name == "@idle"
if paired:
    base_requests = 0
for name in order:
    per = res[name]
    if name == base_name or name.startswith("idle-") or not per:  # /v1/check: only with an upstream
        continue
    if paired and name == "lookup0":  # the one-request base of the unpaired way
        continue
    base = res.get(f"idle-{name}", {}) if paired else res[base_name]
    tot = sum(per.values()); btot = sum(base.values())
    top = max(per, key=per.get)
    print(f"{name:8} all threads {(tot - btot) / (n - base_requests):9.0f} instr/req   worker thread {top}: {(per[top] - base.get(top, 0)) / (n - base_requests):9.0f}   (idle-ish base all {btot}, per-thread {base.get(top,0)})")
