"""The first look (`benches/load/run --only look`): how long a fresh gateway on the shipped
configuration and lists takes to look at every listed name once, through a DNS server on
loopback answering each query after --dns-latency-ms, and what the pass costs that server.

Issue 94's line: the first pass over the shipped lists within 90 s on loopback DNS. The world:
every name of the shipped blocklist served by the DNS server, a share of them (--look-lapsed,
by seed) lapsed (NXDOMAIN), the rest on one of --look-hosts shared throwaway mail hosts; the
canaries answered at once (the server's own rule). Replaces the "The first look" section."""

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

TITLE = "The first look (`--only look`)"


def world(root, seed, hosts, lapsed):
    """The zones lines of the shipped blocklist's names and how many are lapsed."""
    listed = root / "data" / "community" / "disposable-email-domains" / "disposable_email_blocklist.conf"
    names = [l.strip() for l in listed.read_text().splitlines() if l.strip() and not l.startswith("#")]
    rng = random.Random(seed)
    zones, gone = [], 0
    for name in names:
        if rng.random() < lapsed:
            gone += 1
            continue
        zones.append(f"{name} 300 mx{rng.randrange(hosts)}.throwaway-host.net")
    return zones, len(names), gone


def config(root, out, dns_addr, port, admin, max_rate=None, concurrency=None):
    """The shipped configuration, its MX on the loopback server, in `out/conf` (the shipped data
    reached through `out/data`, state in `out/state`); `max_rate` and `concurrency` in place of
    the shipped look's ceiling and background lookups at once, when given."""
    conf = out / "conf"
    conf.mkdir(parents=True)
    (out / "state").mkdir()
    (out / "data").symlink_to(root / "data")
    shutil.copy(root / "conf" / "keys.yaml", conf / "keys.yaml")
    text = (root / "conf" / "gateway.yaml").read_text()
    marker = "    servers: []"
    assert marker in text, "conf/gateway.yaml: mx.servers moved"
    text = text.replace(marker, f"    servers: ['{dns_addr}']", 1)
    for given, shipped, new in ((max_rate, "max_rate: 200,", f"max_rate: {max_rate},"),
                                (concurrency, "concurrency: 8,", f"concurrency: {concurrency},")):
        if given:
            assert shipped in text, f"conf/gateway.yaml: `{shipped}` moved"
            text = text.replace(shipped, new, 1)
    (conf / "gateway.yaml").write_text(text)
    return [str(conf / "gateway.yaml"), "serve", "--listen", f"127.0.0.1:{port}",
            "--admin-listen", f"127.0.0.1:{admin}"]


def run(args, h):
    out = h.OUT / "look"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    zones, names, lapsed = world(h.ROOT, args.seed, args.look_hosts, args.look_lapsed)
    setting = ", ".join(f"{k} {v}" for k, v in (("look.max_rate", args.look_max_rate),
                                                 ("concurrency", args.look_concurrency)) if v) or "as shipped"
    (out / "zones.txt").write_text("\n".join(zones) + "\n")
    counts = out / "counts.json"
    dns = subprocess.Popen(h.PIN["backend"] + [str(h.DNS), "--zones", str(out / "zones.txt"),
                                                "--delay-ms", str(args.dns_latency_ms), "--counts", str(counts)],
                           stdout=subprocess.PIPE, stderr=open(out / "dns.log", "w"), text=True)
    gw = None
    try:
        dns_addr = dns.stdout.readline().split()[-1]
        port, admin = h.free_port(), h.free_port()
        argv = config(h.ROOT, out, dns_addr, port, admin, args.look_max_rate, args.look_concurrency)
        started = time.time()
        gw = subprocess.Popen(h.PIN["server"] + [str(h.BIN), "-c"] + argv, cwd=out,
                              stdout=subprocess.DEVNULL, stderr=open(out / "gateway.log", "w"))
        h.wait_port(admin, timeout=120, proc=gw)
        listening = time.time() - started
        samples, done = [], None
        while time.time() - started < args.look_timeout:
            m = h.admin_metrics(admin)
            t = time.time() - started
            looked = m.get("drg_mx_neighbourhood_looked_total", 0)
            samples.append((t, looked, m.get("drg_mx_neighbourhood_look_rate", 0)))
            if m.get("drg_mx_neighbourhood_look_passes_total", 0) >= 1:
                done = t
                break
            time.sleep(0.5)
        time.sleep(1.5)  # the DNS server writes its counts every second
        totals = json.loads(counts.read_text()).get("totals", {})
    finally:
        if gw:
            gw.terminate()
            gw.wait(timeout=30)
        dns.terminate()
    looked = samples[-1][1] if samples else 0
    peak = max((r for _, _, r in samples), default=0)
    at = {mark: next((n for t, n, _ in samples if t >= mark), looked) for mark in (30, 60, 90)}
    queries = sum(totals.values())
    lines = [f"## {TITLE}", "",
             f"Made by `benches/load/run {' '.join(h.sys.argv[1:])}` on {h.stamp()}: the release binary on the "
             f"shipped configuration and lists (`conf/gateway.yaml`, its MX at a DNS server on loopback answering "
             f"{args.dns_latency_ms} ms after each query), started fresh with no MX snapshot; the look "
             f"{setting}. The world: the {names:,} names of the community blocklist, {lapsed:,} of them lapsed "
             f"(NXDOMAIN, seed {args.seed}), the rest on {args.look_hosts} shared throwaway mail hosts; the "
             f"built-in list's names the look takes too are NXDOMAIN (no zone).", "",
             "| first pass done | listening after | names looked at 30 · 60 · 90 s (the pass: all looked) | pace at its peak | "
             "DNS queries the pass sent | a name looked |",
             "|---:|---:|---:|---:|---:|---:|",
             f"| {'%.0f s' % done if done else f'not within {args.look_timeout} s'} | {listening:.1f} s | "
             f"{at[30]:,.0f} · {at[60]:,.0f} · {at[90]:,.0f} | {peak:.0f} names/s | {queries:,} "
             f"({', '.join(f'{k} {v:,}' for k, v in totals.items())}) | {queries / max(looked, 1):.2f} queries |", "",
             f"Issue 94's line: the first pass over the shipped lists within 90 s on loopback DNS: "
             f"**{'met' if done and done <= 90 else 'not met'}**.", ""]
    h.replace_section(args.results, TITLE, "\n".join(lines))
    if not done:
        raise SystemExit(f"the first pass did not end within {args.look_timeout} s")
