"""Scaling across cores (`--only scaling`): the lookup scenario on the gateway and on the bare
Pingora floor, each with one worker thread, two, and two on Pingora's work-stealing runtime.

What it asks: does the gateway gain from a second worker what the floor gains? Whatever the
request path shares between workers (a lock, an atomic every request writes, one queue) would
show as a scaling factor below the floor's. Every process of every configuration is started
once and serves all rounds (idle between its runs); each round measures them all, in an order
rotated each round, so the factors are paired by round (the same moment of a shared machine).
With three cores or more the servers share cores 0-1 and wrk has core 2; on two, nothing is
pinned (wrk shares the cores in every configuration alike, and the factors compare the two
servers under the same conditions rather than measure a core).

Reports req/s and p99 as medians with their range over the rounds, the scaling factor of each
server (two workers over one, paired by round) and the gateway's over the floor's; writes the
section "Scaling across cores" of --results. `harness.py` calls `run`.
"""

import statistics
import subprocess

# (label, worker threads, work stealing)
CONFIGS = [("1 worker", 1, False), ("2 workers", 2, False), ("2 workers, work-stealing", 2, True)]
TITLE = "Scaling across cores (`--only scaling`)"


def start_floor(h, s, config):
    """A floor on `config` (its workers), answering the gateway's lookup bytes."""
    port = h.free_port()
    body = h.OUT / "floor-lookup.json"
    body.write_text(s.lookup_body)
    log = open(h.OUT / f"{config}.floor.log", "w")
    p = subprocess.Popen(h.PIN["server"] + [str(h.FLOOR), "-c", str(h.OUT / config),
                                            "--answer", f"127.0.0.1:{port}=200:{body}"],
                         stdout=log, stderr=log)
    s.procs.append(p)
    h.wait_port(port)
    return p, port


def pin(h):
    """Every server of every configuration on cores 0-1 and wrk and the upstream on core 2 when
    the machine has three cores or more (the same for one worker as for two); else nothing is
    pinned. What the report says of it."""
    cores = h.os.cpu_count() or 1
    if cores >= 3:
        h.PIN.update(server=["taskset", "-c", "0,1"], wrk=["taskset", "-c", "2"], backend=["taskset", "-c", "2"])
        return "every server on cores 0-1, wrk and the upstream on core 2 (`taskset`)"
    for k in h.PIN:
        h.PIN[k] = []
    return (f"not pinned: two workers take both of the machine's {cores} cores, which wrk shares with "
            "them in every configuration alike (the factors compare the two servers, not a core's capacity)")


def run(args, h):
    pinning = pin(h)
    s = h.Setup(args)
    servers = {}
    try:
        s.start_upstream()
        for i, (label, workers, stealing) in enumerate(CONFIGS):
            args.workers, args.work_stealing = workers, stealing
            name, port = f"gateway-{i}.yaml", (s.gw_port if i == 0 else h.free_port())
            # Metrics recorded as shipped (an admin listener each): their counters are shared too.
            s.write_gateway(name=name, port=port, extra=f"  admin: {{ listen: '127.0.0.1:{h.free_port()}' }}\n")
            s.start_gateway(name=name, port=port)
            if i == 0:
                s.bodies()
            servers[(label, "gateway")] = (s.gw, port)
            servers[(label, "floor")] = start_floor(h, s, name)
        lookup = f"/v1/public/domain/{h.LISTED}"
        auth = (f"Authorization: Bearer {h.KEY}",)
        for (label, who), (p, port) in servers.items():
            status, body = h.fetch(f"http://127.0.0.1:{port}{lookup}", auth if who == "gateway" else ())
            if status != 200 or body != s.lookup_body:
                raise SystemExit(f"{who} ({label}) answered {status} {body[:200]!r}: not the lookup")
        runs = {key: [] for key in servers}
        keys = list(servers)
        for rnd in range(args.rounds):
            for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
                (label, who), (p, port) = key, servers[key]
                r = h.measure(f"http://127.0.0.1:{port}{lookup}", [p.pid], args,
                              auth if who == "gateway" else ())
                runs[key].append(r)
                print(f"round {rnd + 1} {label:26} {who:8} {r['rps']:>9.0f} req/s  p99 {r['p99_us']:>6} us"
                      f"  cpu {r['cpu_us_per_req']:.2f} us/req  errors {r['socket_errors']}", flush=True)
    finally:
        s.stop()
    report(args, h, runs, pinning)


def factor(runs, who, label):
    """The scaling factor of `who` in `label` over its one worker, by round: median and range."""
    return [a["rps"] / b["rps"] for a, b in zip(runs[(label, who)], runs[(CONFIGS[0][0], who)])]


def report(args, h, runs, pinning):
    lines = [f"## {TITLE}", "",
             f"Made by `benches/load/run {' '.join(h.sys.argv[1:])}` on {h.stamp()}: the lookup scenario "
             f"(key, quota, call logs {args.calls}), wrk -t1 -c{args.connections} -d{args.duration}s, "
             f"{args.rounds} rounds, every process started once and measured once a round in an order "
             f"rotated each round; medians with their range over the rounds. Pinning: {pinning}.", "",
             "| configuration | gateway req/s | floor req/s | gateway/floor (paired) | gateway p99 us | "
             "floor p99 us | gateway cpu us/req | floor cpu us/req |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, _, _ in CONFIGS:
        g, f = runs[(label, "gateway")], runs[(label, "floor")]
        paired = [a["rps"] / b["rps"] for a, b in zip(g, f)]
        lines.append(f"| {label} | {h.spread(r['rps'] for r in g)} | {h.spread(r['rps'] for r in f)} | "
                     f"{h.spread(paired, '.2f')} | {h.spread(r['p99_us'] for r in g)} | "
                     f"{h.spread(r['p99_us'] for r in f)} | {h.spread((r['cpu_us_per_req'] for r in g), '.2f')} | "
                     f"{h.spread((r['cpu_us_per_req'] for r in f), '.2f')} |")
    lines += ["", "| scaling over 1 worker (paired by round) | gateway | floor | gateway / floor |",
              "|---|---:|---:|---:|"]
    verdicts = []
    for label, _, _ in CONFIGS[1:]:
        g, f = factor(runs, "gateway", label), factor(runs, "floor", label)
        rel = [a / b for a, b in zip(g, f)]
        lines.append(f"| {label} | {h.spread(g, '.2f')} | {h.spread(f, '.2f')} | **{statistics.median(rel):.2f}** "
                     f"({min(rel):.2f}-{max(rel):.2f}) |")
        verdicts.append(f"{label}: the gateway's factor {statistics.median(rel):.2f} of the floor's "
                        f"({'within' if statistics.median(rel) >= 0.9 else '**not** within'} 10%)")
    lines += ["", "Goal: the gateway's two-worker factor within 10% of the floor's. " + "; ".join(verdicts) + ".", ""]
    h.replace_section(args.results, TITLE, "\n".join(lines))
    print("\n".join(lines))
