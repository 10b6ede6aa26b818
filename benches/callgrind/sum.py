import glob, re, sys
d = sys.argv[1]; n = int(sys.argv[2])
names = {1: "lookup", 2: "unauth", 3: "top", 4: "lookup0", 5: "check"}
res = {}
for k, name in names.items():
    per = {}
    for f in glob.glob(f"{d}/cg.*.{k}-*"):
        tid = f.rsplit("-", 1)[1]
        for line in open(f):
            if line.startswith("summary:") or line.startswith("totals:"):
                per[tid] = int(line.split()[1]); break
    res[name] = per
base = res["lookup0"]
for name in ("lookup", "unauth", "top", "check"):
    per = res[name]
    if not per:  # /v1/check is measured only with an upstream
        continue
    tot = sum(per.values()); btot = sum(base.values())
    top = max(per, key=per.get)
    print(f"{name:8} all threads {(tot - btot) / (n - 1):9.0f} instr/req   worker thread {top}: {(per[top] - base.get(top, 0)) / (n - 1):9.0f}   (idle-ish base all {btot}, per-thread {base.get(top,0)})")
