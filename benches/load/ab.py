"""Before and after in one run: builds of the gateway side by side on the lookup scenario, each
measured against the floor of the same round.

    python3 benches/load/ab.py [--quota local|redis|redis-batched] [--rounds 6] [--duration 5]
                               BIN [BIN ...]

Every round measures each build (a fresh process, after a 1 s warm-up) and the bare Pingora floor,
in an order rotated each round, pinned as the harness pins (`harness.py`). Two runs of the harness
an hour apart on these machines moved the floor itself by 10-20%; here each build's req/s is
divided by the floor's of its own round (the paired ratio), and a build's figures are medians over
rounds. Build the floor first (`cargo build --release --example floor`); copy the binary of the
build before aside, since `cargo build` replaces it. Needs wrk, taskset and redis-server, which
`benches/load/run` installs. Prints a table and writes nothing.
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness as h  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quota", default="local", choices=["local", "redis", "redis-batched"])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("bins", nargs="+", help="gateway binaries (the first also gives the floor its bodies)")
    a = ap.parse_args()
    for b in a.bins:
        if not Path(b).is_file():
            sys.exit(f"{b}: no such binary")
    if not h.FLOOR.exists():
        sys.exit(f"{h.FLOOR} is missing: cargo build --release --example floor")
    args = argparse.Namespace(entries=100_000, workers=1, work_stealing=False, build_priority="low",
                              rdap="on", calls="on", quota=a.quota, upstream_mode=None,
                              connections=a.connections, duration=a.duration, pin=True)
    h.pin(args)
    warm = argparse.Namespace(**{**vars(args), "duration": 1})
    auth = (f"Authorization: Bearer {h.KEY}",)
    s = h.Setup(args)
    s.write_gateway()
    names = list(dict.fromkeys(a.bins)) + ["floor"]
    runs = {n: [] for n in names}
    try:
        s.start_upstream()
        h.BIN = Path(a.bins[0])
        s.start_gateway()
        s.bodies()
        s.start_floor()
        s.stop_gateway()
        for rnd in range(a.rounds):
            for n in names[rnd % len(names):] + names[:rnd % len(names)]:
                if n == "floor":
                    port, pid = s.floor_ports["lookup"], s.floor.pid
                else:
                    h.BIN = Path(n)
                    s.start_gateway()
                    port, pid = s.gw_port, s.gw.pid
                url = f"http://127.0.0.1:{port}/v1/public/domain/{h.LISTED}"
                h.measure(url, [pid], warm, auth)
                r = h.measure(url, [pid], args, auth)
                runs[n].append(r)
                if n != "floor":
                    s.stop_gateway()
                print(f"round {rnd + 1} {n[-48:]:48} {r['rps']:>9.0f} req/s  p99 {r['p99_us']:>6} us"
                      f"  cpu {r['cpu_us_per_req']:.2f} us/req  errors {r['socket_errors'] + r['non2xx']}",
                      flush=True)
    finally:
        s.stop()
    floor = runs["floor"]
    med = statistics.median
    print(f"\nlookup, quota {a.quota}, {a.rounds} rounds of {a.duration} s, medians (range over the "
          f"rounds); floor {h.spread(r['rps'] for r in floor)} req/s, p99 {h.spread(r['p99_us'] for r in floor)} us, "
          f"cpu {h.spread((r['cpu_us_per_req'] for r in floor), '.2f')} us/req\n")
    print("| build | req/s | gateway/floor, paired by round | p99 us | p99 / floor's | cpu us/req | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n in names[:-1]:
        rs = runs[n]
        paired = [r["rps"] / f["rps"] for r, f in zip(rs, floor)]
        p99 = [r["p99_us"] / f["p99_us"] for r, f in zip(rs, floor)]
        errors = sum(r["socket_errors"] + r["non2xx"] for r in rs)
        print(f"| `{n}` | {h.spread(r['rps'] for r in rs)} | **{med(paired):.3f}x** ({min(paired):.3f}-{max(paired):.3f}) "
              f"| {h.spread(r['p99_us'] for r in rs)} | {h.spread(p99, '.2f')} "
              f"| {h.spread((r['cpu_us_per_req'] for r in rs), '.2f')} | {errors} |")


if __name__ == "__main__":
    main()
