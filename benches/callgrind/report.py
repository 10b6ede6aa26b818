"""The number that gates: the gateway's instructions a request over the floor's, per scenario
(the mix against the floor's lookup, which answers it), from the sums `measure` wrote.

    report.py RUN_DIR [--results RESULTS.md] [--check LIMITS] [--command TEXT]

--results: writes the "Instructions per request" section of the results file (newest on top).
--check: fails (exit 1) when a scenario's ratio is over its limit in LIMITS (`scenario ratio`
lines): a change that makes a request dearer than the recorded yardstick fails the check, and
a change that makes it cheaper lowers the limit by hand.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "load"))
import harness  # noqa: E402

TITLE = "Instructions per request (`benches/callgrind/measure`)"
LABELS = {"lookup": "listed lookup", "unauth": "401", "top": "top-domains", "check": "`/v1/check` (relay)",
          "mix": "realistic mix"}


def read(path):
    """scenario -> (all threads, worker thread) instructions a request, from a sum-*.txt file."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if "all threads" in line:
            f = line.split()
            out[f[0]] = (float(f[3]), float(f[8]))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--results")
    ap.add_argument("--check")
    ap.add_argument("--command", default="benches/callgrind/measure")
    args = ap.parse_args()
    run = Path(args.run)
    gw, floor = read(run / "sum-gateway.txt"), read(run / "sum-floor.txt")
    if (run / "sum-mix.txt").exists():
        gw.update({k: v for k, v in read(run / "sum-mix.txt").items() if k == "mix"})
    limits = {}
    if args.check:
        for line in Path(args.check).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, limit = line.split()
                limits[name] = float(limit)
    rows, over = [], []
    for name, (all_threads, worker) in gw.items():
        base = floor.get("lookup" if name == "mix" else name)
        if not base:
            continue
        ratio = all_threads / base[0]
        limit = limits.get(name)
        if limit is not None and ratio > limit:
            over.append(f"{name}: {ratio:.3f}x the floor, over its limit {limit:.3f}x")
        rows.append(f"| {LABELS.get(name, name)} | {all_threads:,.0f} | {worker:,.0f} | {base[0]:,.0f} | "
                    f"**{ratio:.2f}x** | {'' if limit is None else f'{limit:.2f}x'} |")
        print(f"{name:8} {all_threads:9.0f} / {base[0]:9.0f} = {ratio:.2f}x"
              + ("" if limit is None else f"   (limit {limit:.2f}x)"))
    comp = run / "comp-mix.txt"
    section = [f"## {TITLE}", "",
               f"Made by `{args.command}` on {harness.stamp()}: callgrind's instruction counts, steady "
               "under machine load unlike wall-clock figures. N requests a scenario after a warm-up, over every "
               "thread of the process (the worker's alone beside it), against the bare Pingora floor answering "
               "the same bytes (the mix: against the floor's lookup, which answers every path of it). The "
               "gateway runs as shipped in every scenario (since issue 95): call logs, the live "
               "top-domains, MX through a DNS server on loopback with its neighbourhood and look, RDAP "
               "with no registry to ask. Under "
               "valgrind a second holds ~800 of the mix's requests, not the load harness's ~70,000, so work "
               "paced by the clock would weigh ~100 times more a request than at full speed: each "
               "scenario's base is an idle stretch as long as its run, the top-domains ranking is rendered "
               "every 60 s, the neighbourhood learns 1 listed name a second after a queue of 8 (~1 in 800 "
               "requests, as ~1 in 600 at the harness's rate) and its look starts 1 listed name a second. "
               "The worker's column is the request path's own.", "",
               "| scenario | gateway, all threads | gateway, worker | floor | gateway / floor | limit (`--check`) |",
               "|---|---:|---:|---:|---:|---:|", *rows, ""]
    if comp.exists():
        section += ["Where the mix's instructions go (self cost, all threads, a request):", "", "```",
                    *comp.read_text().rstrip("\n").splitlines(), "```", ""]
    if args.results:
        harness.replace_section(args.results, TITLE, "\n".join(section))
    for o in over:
        print(f"over the yardstick: {o}", file=sys.stderr)
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
