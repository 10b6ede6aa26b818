"""Load harness: domain-risk-gateway side by side with nginx, alternating A/B runs of wrk.

Writes benches/RESULTS.md and benches/results.svg. Only loopback addresses are used; each wrk run
lasts --duration seconds. See benches/load/run for the entry point.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benches" / "out"
BIN = ROOT / "target" / "release" / "domain-risk-gateway"
KEY = "drg_bench_key_0123456789abcdefghijklmnopqrstuvwx"
LISTED = "d4242.com"
# Core pinning (`--only costs`): servers on core 0, wrk on core 1, so the servers' threads and
# the load generator do not take turns on one core (the variance that hides a few per cent).
PIN = {"server": [], "wrk": []}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def cpu_seconds(pids):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (FileNotFoundError, IndexError):
            pass
    return total / tick


def children(pid):
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
    except FileNotFoundError:
        return []


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def sha256(s):
    import hashlib
    return hashlib.sha256(s.encode()).hexdigest()


class Setup:
    """Data, configs and processes for one harness run."""

    def __init__(self, args):
        self.args = args
        shutil.rmtree(OUT, ignore_errors=True)
        (OUT / "data").mkdir(parents=True)
        self.gw_port, self.nginx_port, self.up_port = free_port(), free_port(), free_port()
        self.procs = []
        self.gateways = []

    def write_gateway(self, name="gateway.yaml", port=None, extra=""):
        """A gateway config; `extra` lines go at the end of its `gateway:` section."""
        n = self.args.entries
        with open(OUT / "data" / "disposable.txt", "w") as f:
            for i in range(n):
                f.write(f"d{i}.com\n")
        shutil.copy(ROOT / "data" / "free_providers.txt", OUT / "data")
        (OUT / "keys.yaml").write_text(
            f"keys:\n  - id: bench\n    sha256: {sha256(KEY)}\n    plan: unlimited\n")
        (OUT / name).write_text(f"""version: 1
threads: {self.args.workers}
work_stealing: {str(self.args.work_stealing).lower()}
pid_file: {OUT}/{name}.pid
upgrade_sock: {OUT}/{name}.sock
grace_period_seconds: 0
graceful_shutdown_timeout_seconds: 1
upstream_keepalive_pool_size: 256
gateway:
  listen: 127.0.0.1:{port or self.gw_port}
  drain_seconds: 0
  upstream: {{ address: "127.0.0.1:{self.up_port}" }}
  data: {{ dir: data, builtin_disposable: false }}
  reload: {{ poll_interval_ms: 100 }}
  access: {{ keys_file: keys.yaml, plans: {{ unlimited: 1000000000000 }} }}
  quota: {self.quota_yaml()}
  mx: {{ enabled: false }}
{extra}""")

    def quota_yaml(self):
        if self.args.quota == "local":
            return "{ state_file: state/quota.json }"
        self.redis_port = free_port()
        (OUT / "redis").mkdir(exist_ok=True)
        p = subprocess.Popen(["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--dir", str(OUT / "redis")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        wait_port(self.redis_port)
        batch = ", sync_interval_ms: 100, batch_max: 100" if self.args.quota == "redis-batched" else ""
        return (f"{{ store: redis, redis: {{ url: 'redis://127.0.0.1:{self.redis_port}/', "
                f"call_timeout_ms: 100{batch} }} }}")

    def start_gateway(self, env=None, name="gateway.yaml", port=None):
        log = open(OUT / f"{name}.log" if port else OUT / "gateway.log", "w")
        started = time.time()
        p = subprocess.Popen(PIN["server"] + [str(BIN), "-c", str(OUT / name), "serve"],
                             stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info", **(env or {})})
        self.procs.append(p)
        self.gateways.append(p)
        wait_port(port or self.gw_port)
        self.gw = p
        return time.time() - started

    def bodies(self):
        """The gateway's answers, so nginx returns byte-identical bodies."""
        def get(path, auth=True):
            req = urllib.request.Request(f"http://127.0.0.1:{self.gw_port}{path}")
            if auth:
                req.add_header("Authorization", f"Bearer {KEY}")
            try:
                return urllib.request.urlopen(req).read().decode()
            except urllib.error.HTTPError as e:
                return e.read().decode()
        self.lookup_body = get(f"/v1/public/domain/{LISTED}")
        self.top_body = get("/v1/public/top-domains")
        self.unauth_body = get(f"/v1/public/domain/{LISTED}", auth=False)

    def write_nginx(self):
        def q(s):
            return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
        n = self.args.entries
        # The "same job" in nginx: a map of every listed domain to its body, and a map on the key.
        with open(OUT / "nginx-table.map", "w") as f:
            for i in range(n):
                body = self.lookup_body.replace(LISTED, f"d{i}.com")
                f.write(f"/v1/public/domain/d{i}.com {q(body)};\n")
        conf = f"""worker_processes {self.args.workers};
pid {OUT}/nginx.pid;
error_log {OUT}/nginx-error.log warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  map_hash_max_size {max(2 * n, 1024)};
  map_hash_bucket_size 128;
  default_type application/json;
  map $uri $table_body {{
    include {OUT}/nginx-table.map;
  }}
  map $http_authorization $key_ok {{
    default 0;
    "Bearer {KEY}" 1;
  }}
  upstream backend {{ server 127.0.0.1:{self.up_port}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{self.nginx_port} reuseport;
    location = /static/lookup {{ return 200 {q(self.lookup_body)}; }}
    location = /static/top {{ alias {OUT}/top.json; }}
    location = /static/unauthorized {{ return 401 {q(self.unauth_body)}; }}
    location /v1/public/domain/ {{
      if ($key_ok = 0) {{ return 401 {q(self.unauth_body)}; }}
      return 200 $table_body;
    }}
    location /v1/check/ {{
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Authorization "";
      proxy_pass http://backend;
    }}
  }}
  server {{
    listen 127.0.0.1:{self.up_port} reuseport;
    location / {{ return 200 '{{"checked":true}}'; }}
  }}
}}
"""
        (OUT / "top.json").write_text(self.top_body)
        (OUT / "nginx.conf").write_text(conf)

    def start_nginx(self):
        log = open(OUT / "nginx.log", "w")
        p = subprocess.Popen(["nginx", "-p", str(OUT), "-c", str(OUT / "nginx.conf")],
                             stdout=log, stderr=log)
        self.procs.append(p)
        wait_port(self.nginx_port)
        wait_port(self.up_port)
        time.sleep(0.3)
        self.nginx = p

    def stop(self):
        for p in self.procs:
            stop_process(p, signal.SIGINT if p in self.gateways else signal.SIGQUIT)


def stop_process(p, sig=signal.SIGINT):
    """Stops a server; one that does not exit within 10 s is killed and reported."""
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"warning: pid {p.pid} did not stop within 10 s of {sig.name}; killed", file=sys.stderr)
        p.kill()
        p.wait()


def memory_only(args):
    """RSS and start-up time with --entries generated entries, without nginx or load."""
    s = Setup(args)
    s.write_gateway()
    try:
        took = s.start_gateway()
        time.sleep(3)
        rss = rss_kib(s.gw.pid)
    finally:
        s.stop()
    log = (OUT / "gateway.log").read_text()
    print(f"entries {args.entries}: start-up to listening {took:.2f} s, RSS {rss / 1024:.1f} MiB")
    print("\n".join(l for l in log.splitlines() if "table" in l))


# What the operations features cost: the lookup scenario on gateways that differ only by them.
COST_VARIANTS = [
    ("baseline", "metrics recording off, access log off", "  admin: { listen: null, metrics: false }\n"),
    # The same config again: the A/A ratio is the noise floor of the run.
    ("baseline_again", "the baseline again (A/A: the run's noise)", "  admin: { listen: null, metrics: false }\n"),
    ("metrics", "metrics recording on (the default)", "  admin: { listen: null, metrics: true }\n"),
    ("metrics_log", "metrics on + JSON access log to a file",
     "  admin: { listen: null, metrics: true }\n  access_log: { enabled: true, path: access.log }\n"),
]


def feature_costs(args):
    """Alternating rounds of the lookup scenario over the cost variants; medians; ratios to the
    baseline measured in the same run. Replaces the "Feature costs" section of --results."""
    if args.pin and shutil.which("taskset") and (os.cpu_count() or 1) >= 2:
        PIN.update(server=["taskset", "-c", "0"], wrk=["taskset", "-c", "1"])
    s = Setup(args)
    ports = {}
    try:
        for name, _, extra in COST_VARIANTS:
            ports[name] = free_port()
            s.write_gateway(f"{name}.yaml", ports[name], extra)
        auth = (f"Authorization: Bearer {KEY}",)
        runs = {name: [] for name, *_ in COST_VARIANTS}
        for rnd in range(args.rounds):
            order = COST_VARIANTS[rnd % len(COST_VARIANTS):] + COST_VARIANTS[:rnd % len(COST_VARIANTS)]
            for name, *_ in order:
                # A fresh process per measurement: one process's layout (addresses, hash seeds,
                # thread placement) can sit several per cent off another's for the whole run,
                # which a long-lived process per variant would count as the feature's cost.
                s.start_gateway(name=f"{name}.yaml", port=ports[name])
                url = f"http://127.0.0.1:{ports[name]}/v1/public/domain/{LISTED}"
                measure(url, [s.gw.pid], argparse.Namespace(**{**vars(args), "duration": 1}), auth)  # warm-up
                r = measure(url, [s.gw.pid], args, auth)
                stop_process(s.gw)
                s.procs.remove(s.gw)
                s.gateways.remove(s.gw)
                runs[name].append(r)
                print(f"round {rnd + 1} {name:14} {r['rps']:>10.0f} req/s  p50 {r['p50_us']:>6} us"
                      f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                      f"  errors {r['socket_errors'] + r['non2xx']}", flush=True)
        log_lines = sum(1 for _ in open(OUT / "access.log")) if (OUT / "access.log").exists() else 0
    finally:
        s.stop()
    base = runs["baseline"]
    lines = ["## Feature costs", "",
             f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC: "
             f"the lookup scenario (wrk -t1 -c{args.connections} -d{args.duration}s) on gateways that differ only by "
             f"the feature, {args.rounds} rotating rounds (a fresh gateway process for each measurement, after a 1 s warm-up), "
             f"medians; ratio = req/s against the baseline of the same run. "
             f"Pinning: {'gateways on core 0 (all their threads, the access-log writer included), wrk on core 1' if PIN['wrk'] else 'none'}.",
             "Paired ratio: the median over rounds of the variant's req/s (or CPU per request) over the baseline's "
             "in the same round, which cancels the drift between rounds; `baseline_again` (the same config) shows "
             "the noise floor.",
             "", "| variant | req/s | ratio to baseline | paired ratio | paired cpu ratio | p50 us | p99 us | cpu us/req | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, desc, _ in COST_VARIANTS:
        rs = runs[name]
        paired = statistics.median(r["rps"] / b["rps"] for r, b in zip(rs, base))
        paired_cpu = statistics.median(r["cpu_us_per_req"] / b["cpu_us_per_req"] for r, b in zip(rs, base))
        lines.append(f"| {name} ({desc}) | {med(rs, 'rps'):.0f} | **{med(rs, 'rps') / med(base, 'rps'):.3f}x** | "
                     f"{paired:.3f}x | {paired_cpu:.3f}x | "
                     f"{med(rs, 'p50_us'):.0f} | {med(rs, 'p99_us'):.0f} | {med(rs, 'cpu_us_per_req'):.2f} | "
                     f"{sum(r['socket_errors'] + r['non2xx'] for r in rs)} |")
    lines += ["", f"Access log lines written during the run: {log_lines}.", ""]
    section = "\n".join(lines)
    print(section)
    path = Path(args.results)
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    text = re.sub(r"\n## Feature costs\n.*?(?=\n## |\Z)", "", text, flags=re.S)
    path.write_text(text.rstrip("\n") + "\n\n" + section)


def wrk(url, args, headers=()):
    cmd = PIN["wrk"] + ["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--timeout", "5s",
           "-s", str(ROOT / "benches" / "load" / "report.lua")]
    for h in headers:
        cmd += ["-H", h]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=args.duration + 30).stdout
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    r = json.loads(line)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    return r


def measure(url, pids, args, headers=()):
    before = cpu_seconds(pids)
    r = wrk(url, args, headers)
    r["cpu_us_per_req"] = (cpu_seconds(pids) - before) * 1e6 / max(r["requests"], 1)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--work-stealing", action="store_true", help="Pingora's work-stealing runtime")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--quota", default="local", choices=["local", "redis", "redis-batched"],
                    help="the gateway's quota store (redis-server is started by the harness)")
    ap.add_argument("--pin", action="store_true",
                    help="with --only costs: gateways on core 0, wrk on core 1 (taskset)")
    ap.add_argument("--results", default=str(ROOT / "benches" / "RESULTS.md"))
    args = ap.parse_args()
    if args.only == "memory":
        return memory_only(args)
    if args.only == "costs":
        return feature_costs(args)

    s = Setup(args)
    s.write_gateway()
    try:
        gw_start = s.start_gateway()
        s.bodies()
        s.write_nginx()
        s.start_nginx()
        gw_pids = lambda: [s.gw.pid]
        ng_pids = lambda: [s.nginx.pid] + children(s.nginx.pid)
        auth = (f"Authorization: Bearer {KEY}",)
        G = f"http://127.0.0.1:{s.gw_port}"
        N = f"http://127.0.0.1:{s.nginx_port}"
        scenarios = [
            ("lookup", "lookup of a listed domain (auth, origin, quota on) vs nginx `return 200` of the same body",
             (G + f"/v1/public/domain/{LISTED}", auth), (N + "/static/lookup", ())),
            ("lookup_same_job", "the same lookup vs nginx doing the job: `map` of the table to bodies + `map` on the key",
             (G + f"/v1/public/domain/{LISTED}", auth), (N + f"/v1/public/domain/{LISTED}", auth)),
            ("unauthorized", "rejected request (401, connection kept) vs nginx `return 401`",
             (G + f"/v1/public/domain/{LISTED}", ()), (N + "/static/unauthorized", ())),
            ("top_domains", "/v1/public/top-domains (100 entries) vs nginx serving the same body from a file (too long for `return`)",
             (G + "/v1/public/top-domains", auth), (N + "/static/top", ())),
            ("check_proxied", "/v1/check proxied to a local upstream vs nginx `proxy_pass` (keepalive) to it",
             (G + "/v1/check/user%40example.com", auth), (N + "/v1/check/user%40example.com", auth)),
        ]
        only = set(filter(None, args.only.split(",")))
        scenarios = [sc for sc in scenarios if not only or sc[0] in only]
        runs = {name: {"gateway": [], "nginx": []} for name, *_ in scenarios}
        for rnd in range(args.rounds):
            for name, _, (gu, gh), (nu, nh) in scenarios:
                order = [("gateway", gu, gh, gw_pids), ("nginx", nu, nh, ng_pids)]
                if rnd % 2:
                    order.reverse()
                for who, url, hdr, pids in order:
                    r = measure(url, pids(), args, hdr)
                    runs[name][who].append(r)
                    print(f"round {rnd + 1} {name:16} {who:8} {r['rps']:>10.0f} req/s  p50 {r['p50_us']:>6} us"
                          f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                          f"  errors {r['socket_errors']}", flush=True)
        storm = None
        if not only or "reload_storm" in only:
            storm = reload_storm(s, args, G + f"/v1/public/domain/{LISTED}", auth)
        mem = memory(s, args, gw_start)
    finally:
        s.stop()
    report(args, scenarios, runs, storm, mem)


def reload_storm(s, args, url, auth):
    """Steady runs, then runs during a table swap every 100 ms; gateway only."""
    steady = [measure(url, [s.gw.pid], args, auth) for _ in range(args.rounds)]
    stop = threading.Event()
    swaps = [0]
    path = OUT / "data" / "disposable.txt"
    text = path.read_text()

    def storm():
        i = 0
        while not stop.is_set():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + f"storm{i}.com\n")
            os.replace(tmp, path)
            swaps[0] += 1
            i += 1
            time.sleep(0.1)
    t = threading.Thread(target=storm)
    t.start()
    try:
        stormy = [measure(url, [s.gw.pid], args, auth) for _ in range(args.rounds)]
    finally:
        stop.set()
        t.join()
    log = (OUT / "gateway.log").read_text()
    for r in steady + stormy:
        print(f"reload_storm {'':8} {r['rps']:>10.0f} req/s p99 {r['p99_us']} us p99.99 {r['p9999_us']} us errors {r['socket_errors'] + r['non2xx']}")
    return {"steady": steady, "storm": stormy, "writes": swaps[0], "log_errors": log.count("reload failed")}


def memory(s, args, gw_start):
    rss_n = rss_kib(s.gw.pid)
    s.stop()
    s.procs = []
    # The shipped defaults: built-in list + data/.
    p = subprocess.Popen([str(BIN), "-c", str(ROOT / "conf" / "gateway.yaml"), "serve", "--listen",
                          f"127.0.0.1:{free_port()}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "RUST_LOG": "warn"}, cwd=ROOT)
    time.sleep(2.0)
    rss_default = rss_kib(p.pid)
    stop_process(p)
    shutil.rmtree(ROOT / "state", ignore_errors=True)
    return {"rss_default_kib": rss_default, "rss_entries_kib": rss_n, "start_seconds": gw_start}


def med(rs, key):
    return statistics.median(r[key] for r in rs)


def report(args, scenarios, runs, storm, mem):
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except StopIteration:
        pass
    def version(cmd):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True)
            return (p.stdout + p.stderr).strip().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return "?"
    rows = []
    for name, desc, *_ in scenarios:
        g, n = runs[name]["gateway"], runs[name]["nginx"]
        rows.append({
            "name": name, "desc": desc,
            "g_rps": med(g, "rps"), "n_rps": med(n, "rps"),
            "g_p50": med(g, "p50_us"), "n_p50": med(n, "p50_us"),
            "g_p99": med(g, "p99_us"), "n_p99": med(n, "p99_us"),
            "g_cpu": med(g, "cpu_us_per_req"), "n_cpu": med(n, "cpu_us_per_req"),
            "g_err": sum(r["socket_errors"] for r in g),
        })
    lines = [
        "# Benchmark results",
        "",
        f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC.",
        "",
        f"- machine: {os.cpu_count()} cores, {cpu}, Linux {platform.release()}",
        f"- versions: {version([str(BIN), '--version'])}; {version(['nginx', '-v'])}; {version(['wrk', '-v'])}; {version(['rustc', '--version'])}",
        f"- load: wrk -t1 -c{args.connections} -d{args.duration}s on the same box; server workers/threads: {args.workers}"
        f" (Pingora work_stealing: {args.work_stealing}); quota store: {args.quota}; {args.rounds} alternating A/B rounds, medians shown",
        f"- table: {args.entries} generated disposable domains (`d<i>.com`); nginx's `map` holds the same {args.entries} bodies",
        "- cpu: server CPU time (user+sys from /proc) per request, microseconds",
        "",
        "| scenario | gateway req/s | nginx req/s | ratio | p50 us (gw / nginx) | p99 us (gw / nginx) | cpu us/req (gw / nginx) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['name']} | {r['g_rps']:.0f} | {r['n_rps']:.0f} | **{r['g_rps'] / r['n_rps']:.2f}x** | "
                     f"{r['g_p50']:.0f} / {r['n_p50']:.0f} | {r['g_p99']:.0f} / {r['n_p99']:.0f} | {r['g_cpu']:.2f} / {r['n_cpu']:.2f} |")
    lines += ["", "Scenarios:", ""] + [f"- `{r['name']}`: {r['desc']}" for r in rows]
    if storm:
        st, so = storm["steady"], storm["storm"]
        errors = sum(r["socket_errors"] + r["non2xx"] for r in so)
        lines += ["", "## Reload storm", "",
                  f"The lookup scenario on the gateway while `disposable.txt` ({args.entries} entries) is replaced every 100 ms "
                  f"({storm['writes']} writes; failed reloads logged: {storm['log_errors']}).", "",
                  "| | req/s | p50 us | p99 us | p99.99 us | failed requests |", "|---|---:|---:|---:|---:|---:|",
                  f"| steady | {med(st, 'rps'):.0f} | {med(st, 'p50_us'):.0f} | {med(st, 'p99_us'):.0f} | {med(st, 'p9999_us'):.0f} | {sum(r['socket_errors'] + r['non2xx'] for r in st)} |",
                  f"| storm | {med(so, 'rps'):.0f} | {med(so, 'p50_us'):.0f} | {med(so, 'p99_us'):.0f} | {med(so, 'p9999_us'):.0f} | {errors} |",
                  "", f"p99 storm / steady: **{med(so, 'p99_us') / max(med(st, 'p99_us'), 1):.2f}x**"]
    lines += ["", "## Memory", "",
              f"- RSS with the shipped defaults (built-in list + data/, ~56.5k names): {mem['rss_default_kib'] / 1024:.1f} MiB",
              f"- RSS with {args.entries} generated entries (after the load): {mem['rss_entries_kib'] / 1024:.1f} MiB",
              f"- start-up to listening with {args.entries} entries: {mem['start_seconds']:.2f} s",
              "", "![throughput and p99 per scenario](results.svg)", ""]
    # Keep the feature-cost section a `--only costs` run wrote.
    old = Path(args.results).read_text() if Path(args.results).exists() else ""
    costs = re.search(r"\n## Feature costs\n.*?(?=\n## |\Z)", old, flags=re.S)
    if costs:
        lines.append(costs.group(0).strip("\n") + "\n")
    Path(args.results).write_text("\n".join(lines))
    svg(rows, Path(args.results).with_name("results.svg"))
    print("\n".join(lines))


def svg(rows, path):
    """A grouped bar chart: req/s and p99 per scenario, gateway vs nginx."""
    w, h, pad = 900, 420, 60
    panel_w = (w - 3 * pad) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    colors = {"gateway": "#d35400", "nginx": "#2e86c1"}
    for pi, (title, gk, nk) in enumerate([("requests/s (higher is better)", "g_rps", "n_rps"),
                                          ("p99 latency, us (lower is better)", "g_p99", "n_p99")]):
        x0 = pad + pi * (panel_w + pad)
        top, bottom = 40, h - 90
        vmax = max(max(r[gk], r[nk]) for r in rows) * 1.1 or 1
        out.append(f'<text x="{x0}" y="24" font-size="14" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{bottom}" x2="{x0 + panel_w}" y2="{bottom}" stroke="#333"/>')
        gw = panel_w / len(rows)
        for i, r in enumerate(rows):
            for j, (who, key) in enumerate([("gateway", gk), ("nginx", nk)]):
                bh = (bottom - top) * r[key] / vmax
                bx = x0 + i * gw + 6 + j * (gw - 12) / 2
                out.append(f'<rect x="{bx:.1f}" y="{bottom - bh:.1f}" width="{(gw - 12) / 2 - 2:.1f}" height="{bh:.1f}" fill="{colors[who]}"/>')
                out.append(f'<text x="{bx + (gw - 12) / 4:.1f}" y="{bottom - bh - 3:.1f}" text-anchor="middle" font-size="9">{r[key]:.0f}</text>')
            out.append(f'<text x="{x0 + i * gw + gw / 2:.1f}" y="{bottom + 14}" text-anchor="end" transform="rotate(-30 {x0 + i * gw + gw / 2:.1f} {bottom + 14})">{r["name"]}</text>')
    out.append(f'<rect x="{pad}" y="{h - 22}" width="12" height="12" fill="{colors["gateway"]}"/><text x="{pad + 16}" y="{h - 12}">domain-risk-gateway</text>')
    out.append(f'<rect x="{pad + 160}" y="{h - 22}" width="12" height="12" fill="{colors["nginx"]}"/><text x="{pad + 176}" y="{h - 12}">nginx</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


if __name__ == "__main__":
    main()
