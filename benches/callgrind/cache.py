"""Simulated cache misses a request (`CACHE=1 benches/callgrind/measure`): what instructions do
not show. Callgrind's cache simulation (`--cache-sim=yes`, the caches named in `measure`) counts
the misses of the first-level instruction and data caches and of the level behind them, over
every thread, for each scenario of the gateway and of the floor, as `sum.py` pairs the dumps.

    cache.py RUN N
RUN: measure's folder (out-gateway, out-floor, out-mix and their order-*.txt); N: requests.
"""
import glob
import sys

EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")


def totals(folder, dump):
    """The events of dump number `dump`, summed over its threads."""
    out = [0] * len(EVENTS)
    for path in glob.glob(f"{folder}/cg.*.{dump}-*"):
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    # Trailing zero counts are left out of the line.
                    values = [int(x) for x in line.split()[1:]]
                    for i, v in enumerate(values[: len(EVENTS)]):
                        out[i] += v
                    break
    return out


def per_request(folder, n):
    """Scenario -> events a request: each dump less its idle twin (`idle-X`) when it has one,
    else less the one-request `lookup0` (the floor's way)."""
    order = open(f"{folder}/order.txt").read().strip().split(",")
    number = {name: k + 1 for k, name in enumerate(order)}
    out = {}
    for name in order:
        if name.startswith("idle") or name == "lookup0":
            continue
        if f"idle-{name}" in number:
            base, base_requests = number[f"idle-{name}"], 0
        elif name == "mix":
            base, base_requests = number["idle"], 0
        else:
            base, base_requests = number["lookup0"], 1
        a, b = totals(folder, number[name]), totals(folder, base)
        out[name] = [(x - y) / (n - base_requests) for x, y in zip(a, b)]
    return out


def main():
    run, n = sys.argv[1], int(sys.argv[2])
    gateway = per_request(f"{run}/out-gateway", n)
    floor = per_request(f"{run}/out-floor", n) if glob.glob(f"{run}/out-floor/order.txt") else {}
    if glob.glob(f"{run}/out-mix/order.txt"):
        gateway["mix"] = per_request(f"{run}/out-mix", n)["mix"]
    print("scenario   server      instr   I1 misses   D1 misses   L2 misses   (a request)")
    for name, g in gateway.items():
        rows = [("gateway", g)]
        f = floor.get("lookup" if name == "mix" else name)
        if f:
            rows.append(("floor", f))
        for who, e in rows:
            i1, d1, ll = e[3], e[4] + e[5], e[6] + e[7] + e[8]
            print(f"{name:10} {who:8} {e[0]:9.0f} {i1:11.0f} {d1:11.0f} {ll:11.1f}")
        if f:
            ratio = lambda a, b: f"{a / b:.2f}x" if b > 0 else "-"
            print(f"{'':10} {'ratio':8} {ratio(g[0], f[0]):>9} {ratio(g[3], f[3]):>11} "
                  f"{ratio(g[4] + g[5], f[4] + f[5]):>11} {ratio(sum(g[6:]), sum(f[6:])):>11}")


if __name__ == "__main__":
    main()
