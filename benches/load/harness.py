"""Load harness: domain-risk-gateway side by side with nginx, the bare Pingora floor
(examples/floor.rs), HAProxy and nginx + Lua (benches/load/lua/), alternating runs of wrk.

Writes benches/RESULTS.md and benches/results.svg. Only loopback addresses are used; each wrk run
lasts --duration seconds. See benches/load/run for the entry point.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import breakdown  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benches" / "out"
# DRG_BIN, DRG_FLOOR: other builds of the gateway and of the floor (e.g. a baseline's copies,
# each pair built with one profile) for the same scenarios.
BIN = Path(os.environ.get("DRG_BIN", ROOT / "target" / "release" / "domain-risk-gateway"))
FLOOR = Path(os.environ.get("DRG_FLOOR", ROOT / "target" / "release" / "examples" / "floor"))
EMBED = ROOT / "target" / "release" / "examples" / "embed"
DNS = ROOT / "target" / "release" / "examples" / "dns_loopback"
KEY = "drg_bench_key_0123456789abcdefghijklmnopqrstuvwx"
# HAProxy's quota check: a second key with a small limit, to see its 429 before measuring.
LIMITED_KEY = "drg_bench_limited_0123456789abcdefghijklmnopqrs"
LIMITED_CALLS = 3
# A browser key: authorised from BROWSER_ORIGIN only (403 from any other origin).
BROWSER_KEY = "drg_bench_browser_0123456789abcdefghijklmnopqrs"
BROWSER_ORIGIN = "https://app.bench.example"
LISTED = "d4242.com"
# The Lua peer: nginx + the Lua module (Debian packages libnginx-mod-http-lua, which brings the
# NDK module, lua-resty-core and lua-resty-lrucache), config template and module in LUA_DIR.
LUA_DIR = ROOT / "benches" / "load" / "lua"
NGINX_MODULES = Path("/usr/lib/nginx/modules")
UPSTREAM_BODY = '{"checked":true}'
# Core pinning (on unless --no-pin): the servers under test on their own core(s), wrk and the
# backends (the /v1/check upstream, Redis) on another, so the servers' threads and the load
# generator do not take turns on one core (the variance that hides a few per cent), and
# per-core figures are per core.
PIN = {"server": [], "wrk": [], "backend": []}


def pin(args):
    """Fills PIN from --pin/--workers; says why when pinning is not possible."""
    cores = os.cpu_count() or 1
    if not args.pin:
        return
    if not shutil.which("taskset"):
        print("note: taskset not found: no core pinning", file=sys.stderr)
    elif cores < args.workers + 1:
        print(f"note: {cores} cores cannot hold {args.workers} server core(s) plus one for wrk: "
              "no core pinning", file=sys.stderr)
    else:
        servers = ",".join(str(c) for c in range(args.workers))
        PIN.update(server=["taskset", "-c", servers], wrk=["taskset", "-c", str(args.workers)],
                   backend=["taskset", "-c", str(args.workers)])


def pin_note():
    if not PIN["wrk"]:
        return "none"
    return (f"servers under test on core(s) {PIN['server'][2]}, wrk and the backends (upstream, Redis) "
            f"on core {PIN['wrk'][2]} (`taskset`)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[-1]}: exited with {proc.returncode} before listening on {port}")
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
        self.up_status_port = free_port()
        self.procs = []
        self.gateways = []
        self.floor = self.haproxy = self.lua = self.upstream = self.redis = None
        self.haproxy_skipped = self.lua_skipped = None

    def write_gateway(self, name="gateway.yaml", port=None, extra="", mx="{ enabled: false }"):
        """A gateway config; `extra` lines go at the end of its `gateway:` section; `mx` is its
        `mx:` section (off unless a scenario brings a DNS server on loopback). RDAP is on, as
        shipped, with no registry to ask (no bootstrap): its cost on the lookup path, and no
        request leaves the machine."""
        n = self.args.entries
        with open(OUT / "data" / "disposable.txt", "w") as f:
            for i in range(n):
                f.write(f"d{i}.com\n")
        shutil.copy(ROOT / "data" / "free_providers.txt", OUT / "data")
        # The shipped mail providers: a company on Google Workspace or Microsoft 365 is known by
        # its MX host, as on a gateway in service (no address asked).
        shutil.copy(ROOT / "data" / "mx_providers.csv", OUT / "data")
        # The bench key (a server key, no quota in sight), a key limited to LIMITED_CALLS calls a
        # month and a browser key with one authorised origin: the last two give the gateway's
        # 429 and 403 (status, headers, body) that the Lua peer is checked against.
        (OUT / "keys.yaml").write_text(
            f"keys:\n  - id: bench\n    sha256: {sha256(KEY)}\n    plan: unlimited\n"
            f"  - id: limited\n    sha256: {sha256(LIMITED_KEY)}\n    plan: limited\n"
            f"  - id: browser\n    sha256: {sha256(BROWSER_KEY)}\n    plan: unlimited\n"
            f"    origins: [{BROWSER_ORIGIN}]\n")
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
  upstream: {{ address: "127.0.0.1:{self.up_port}"{self.upstream_mode_yaml()} }}
  data: {{ dir: data, builtin_disposable: false }}
  reload: {{ poll_interval_ms: 100, build_priority: {self.args.build_priority} }}
  access: {{ keys_file: keys.yaml, plans: {{ unlimited: 1000000000000, limited: {LIMITED_CALLS} }} }}
  quota: {self.quota_yaml()}
  mx: {mx}
  rdap: {{ enabled: {str(self.args.rdap == "on").lower()}, bootstrap_file: no-bootstrap.json }}
  top_domains: {{ state_file: state/top_domains.json }}
{"  calls: { enabled: false }" + chr(10) if self.args.calls == "off" else ""}{extra}""")

    def upstream_mode_yaml(self):
        """`gateway.upstream.mode` when --upstream-mode is given (else the gateway's default)."""
        mode = getattr(self.args, "upstream_mode", None)
        return f", mode: {mode}" if mode else ""

    def quota_yaml(self):
        if self.args.quota == "local":
            return "{ state_file: state/quota.json }"
        self.redis_port = free_port()
        (OUT / "redis").mkdir(exist_ok=True)
        p = subprocess.Popen(PIN["backend"] + ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                              "--save", "", "--dir", str(OUT / "redis")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        self.redis = p
        wait_port(self.redis_port)
        batch = (f", sync_interval_ms: 100, batch_max: {getattr(self.args, 'batch_max', 1000)}"
                 if self.args.quota == "redis-batched" else "")
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
        # The lookup flags LISTED: once the live ranking is re-rendered (render_interval_ms,
        # 1 s) it leads top-domains, and further lookups of it change no byte of the body.
        time.sleep(1.5)
        self.top_body = get("/v1/public/top-domains")
        self.unauth_body = get(f"/v1/public/domain/{LISTED}", auth=False)

    def refusals(self):
        """The gateway's refusals with their headers (after `bodies()`, whose top-domains body
        they leave as it is: only LISTED is looked up), for the Lua peer's check: a wrong key
        (401), the browser key from another origin (403) and from its own, the limited key's
        calls up to its 429."""
        url = f"http://127.0.0.1:{self.gw_port}/v1/public/domain/{LISTED}"
        # When they were asked: a time-dependent header read later may have moved by the
        # seconds since (`same_answer`'s drift).
        self.refused_at = time.monotonic()
        self.refused = {
            "wrong key": fetch_full(url, ("Authorization: Bearer drg_not_a_key",)),
            "other origin": fetch_full(url, (f"Authorization: Bearer {BROWSER_KEY}",
                                             "Origin: https://elsewhere.example")),
            "no origin": fetch_full(url, (f"Authorization: Bearer {BROWSER_KEY}",)),
            "own origin": fetch_full(url, (f"Authorization: Bearer {BROWSER_KEY}",
                                           f"Origin: {BROWSER_ORIGIN}")),
        }
        for i in range(LIMITED_CALLS + 1):
            self.refused[f"limited key, call {i + 1}"] = fetch_full(
                url, (f"Authorization: Bearer {LIMITED_KEY}",))

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
  # 256 idle connections kept, as the gateway's `upstream_keepalive_pool_size` in this run.
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
}}
"""
        (OUT / "top.json").write_text(self.top_body)
        (OUT / "nginx.conf").write_text(conf)

    def start_upstream(self):
        """The /v1/check backend every proxy talks to: its own nginx process (so no server
        under test is charged its CPU), on the backend core; its stub_status counts the
        connections the proxies open to it."""
        (OUT / "upstream").mkdir(exist_ok=True)
        conf = f"""worker_processes 1;
pid {OUT}/upstream/nginx.pid;
error_log {OUT}/upstream/error.log warn;
daemon off;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{self.up_port} reuseport;
    location / {{ default_type application/json; return 200 '{UPSTREAM_BODY}'; }}
  }}
  server {{
    listen 127.0.0.1:{self.up_status_port};
    location / {{ stub_status; }}
  }}
}}
"""
        (OUT / "upstream" / "nginx.conf").write_text(conf)
        log = open(OUT / "upstream" / "nginx.log", "w")
        p = subprocess.Popen(PIN["backend"] + ["nginx", "-p", str(OUT / "upstream"), "-c",
                                               str(OUT / "upstream" / "nginx.conf")], stdout=log, stderr=log)
        self.procs.append(p)
        wait_port(self.up_port)
        wait_port(self.up_status_port)
        self.upstream = p

    def upstream_accepts(self):
        """Connections the upstream has accepted so far, this query's own excluded."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.up_status_port}/").read().decode()
        return int(text.splitlines()[2].split()[0]) - 1

    def start_with_floor(self):
        """The upstream, the gateway (whose answers give the floor its bodies) and the floor."""
        self.start_upstream()
        self.start_gateway()
        self.bodies()
        self.start_floor()

    def stop_gateway(self):
        """Stops the gateway (or example) under test, for a fresh one per measurement."""
        stop_process(self.gw)
        self.procs.remove(self.gw)
        self.gateways.remove(self.gw)

    def start_embed(self):
        """examples/embed.rs, a host proxy with the domain-risk routes under /v1/, on the
        gateway's config and port; its own routes go to the upstream."""
        log = open(OUT / "embed.log", "w")
        p = subprocess.Popen(PIN["server"] + [str(EMBED), "-c", str(OUT / "gateway.yaml"),
                                              "--listen", f"127.0.0.1:{self.gw_port}",
                                              "--upstream", f"127.0.0.1:{self.up_port}"],
                             stdout=log, stderr=log, env={**os.environ, "RUST_LOG": "info"})
        self.procs.append(p)
        self.gateways.append(p)
        wait_port(self.gw_port)
        self.gw = p

    def start_floor(self):
        """The bare Pingora floor (examples/floor.rs) on the gateway's config: one answer
        listener per fixed body, one bare proxy listener."""
        self.floor_ports = {k: free_port() for k in ("lookup", "unauthorized", "top", "proxy")}
        files = {"lookup": (200, self.lookup_body), "unauthorized": (401, self.unauth_body),
                 "top": (200, self.top_body)}
        cmd = PIN["server"] + [str(FLOOR), "-c", str(OUT / "gateway.yaml")]
        for name, (status, body) in files.items():
            (OUT / f"floor-{name}.json").write_text(body)
            cmd += ["--answer", f"127.0.0.1:{self.floor_ports[name]}={status}:{OUT}/floor-{name}.json"]
        cmd += ["--proxy", f"127.0.0.1:{self.floor_ports['proxy']}"]
        log = open(OUT / "floor.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=log)
        self.procs.append(p)
        for port in self.floor_ports.values():
            wait_port(port)
        self.floor = p

    def write_haproxy(self):
        """HAProxy doing the gateway's job: keys (SHA-256 of the bearer token) in a map, 401
        otherwise; per-key counting in a stick table, 429 past the key's limit; the domain
        bodies in a map answered with `http-request return`; /v1/check proxied to the upstream
        with a kept-alive connection pool."""
        n = self.args.entries
        with open(OUT / "haproxy-domains.map", "w") as f:
            for i in range(n):
                body = self.lookup_body.replace(LISTED, f"d{i}.com")
                f.write(f"/v1/public/domain/d{i}.com {body}\n")
        (OUT / "haproxy-keys.map").write_text(f"{sha256(KEY)} bench\n{sha256(LIMITED_KEY)} limited\n")
        (OUT / "haproxy-limits.map").write_text(f"bench 1000000000000\nlimited {LIMITED_CALLS}\n")
        (OUT / "haproxy-401.json").write_text(self.unauth_body)
        (OUT / "haproxy-429.json").write_text(
            '{"error":{"code":"quota_exceeded","message":"monthly quota exhausted"}}')
        (OUT / "top.json").write_text(self.top_body)
        bufsize = 16384
        while bufsize < len(self.top_body.encode()) + 4096:
            bufsize *= 2
        self.haproxy_port = free_port()
        conf = f"""global
  nbthread {self.args.workers}
  maxconn 4096
  tune.bufsize {bufsize}

defaults
  mode http
  timeout connect 1s
  timeout client 60s
  timeout server 5s
  timeout http-request 10s
  timeout http-keep-alive 60s

frontend api
  bind 127.0.0.1:{self.haproxy_port}
  # The key: SHA-256 of the bearer token looked up in a map of key hashes (as the gateway keeps them).
  http-request set-var(txn.key) req.hdr(authorization),regsub(^Bearer\\ ,),sha2(256),hex,lower,map({OUT}/haproxy-keys.map)
  http-request return status 401 content-type application/json file {OUT}/haproxy-401.json hdr WWW-Authenticate "Bearer realm=\\"domain-risk\\"" unless {{ var(txn.key) -m found }}
  # Per-key counting: the request count in a stick table, 429 past the key's plan limit.
  http-request set-var(txn.limit) var(txn.key),map_str_int({OUT}/haproxy-limits.map)
  http-request track-sc0 var(txn.key) table keys
  http-request return status 429 content-type application/json file {OUT}/haproxy-429.json if {{ sc_http_req_cnt(0),sub(txn.limit) gt 0 }}
  http-request set-var(txn.body) path,map({OUT}/haproxy-domains.map) if {{ path_beg /v1/public/domain/ }}
  http-request return status 200 content-type application/json lf-string "%[var(txn.body)]" if {{ var(txn.body) -m found }}
  http-request return status 200 content-type application/json file {OUT}/top.json if {{ path /v1/public/top-domains }}
  use_backend check if {{ path_beg /v1/check/ }}

backend keys
  stick-table type string len 32 size 100k expire 24d store http_req_cnt

backend check
  http-reuse always
  option forwardfor
  http-request del-header authorization
  http-request set-header X-Api-Key-Id %[var(txn.key)]
  server upstream 127.0.0.1:{self.up_port}
"""
        (OUT / "haproxy.cfg").write_text(conf)

    def start_haproxy(self):
        """Starts HAProxy when installed and its config checks; else says why and skips it."""
        if not shutil.which("haproxy"):
            self.haproxy_skipped = "haproxy is not installed (Debian package `haproxy`)"
            print(f"note: {self.haproxy_skipped}: HAProxy skipped", file=sys.stderr)
            return
        self.write_haproxy()
        check = subprocess.run(["haproxy", "-c", "-f", str(OUT / "haproxy.cfg")],
                               capture_output=True, text=True)
        if check.returncode != 0:
            alerts = [l for l in (check.stdout + check.stderr).splitlines() if "ALERT" in l]
            self.haproxy_skipped = f"config check failed: {' '.join(alerts[:2])}"
            print(f"warning: HAProxy {self.haproxy_skipped}: HAProxy skipped", file=sys.stderr)
            return
        log = open(OUT / "haproxy.log", "w")
        p = subprocess.Popen(PIN["server"] + ["haproxy", "-db", "-f", str(OUT / "haproxy.cfg")],
                             stdout=log, stderr=log)
        self.procs.append(p)
        try:
            wait_port(self.haproxy_port, proc=p)
        except RuntimeError:
            alerts = [l for l in (OUT / "haproxy.log").read_text().splitlines() if "ALERT" in l]
            self.haproxy_skipped = f"did not start: {' '.join(alerts[:2])}"
            print(f"warning: HAProxy {self.haproxy_skipped}: HAProxy skipped", file=sys.stderr)
            return
        self.haproxy = p

    def write_lua(self):
        """The Lua peer's config (benches/load/lua/nginx.conf.in filled in) and its keys: the
        gateway's three keys by SHA-256, with their ids, plans' monthly limits and origins. The
        domain lists are the gateway's own files (OUT/data); top-domains the body it answered."""
        d = OUT / "lua"
        d.mkdir(exist_ok=True)
        self.lua_port = free_port()
        keys = [(KEY, "bench", 1_000_000_000_000, "-"), (LIMITED_KEY, "limited", LIMITED_CALLS, "-"),
                (BROWSER_KEY, "browser", 1_000_000_000_000, BROWSER_ORIGIN)]
        (d / "keys.tsv").write_text("".join(f"{sha256(k)}\t{i}\t{i}\t{n}\t{o}\n" for k, i, n, o in keys))
        (d / "top.json").write_text(self.top_body)
        conf = (LUA_DIR / "nginx.conf.in").read_text()
        for name, value in {"MODULES": NGINX_MODULES, "WORKERS": self.args.workers, "OUT": d,
                            "LUA": LUA_DIR, "DATA": OUT / "data", "UPSTREAM_PORT": self.up_port,
                            "PORT": self.lua_port, "DATASET_VERSION": f"lua-{self.args.entries}"}.items():
            conf = conf.replace(f"@{name}@", str(value))
        (d / "nginx.conf").write_text(conf)

    def start_lua(self):
        """Starts the Lua peer when nginx's Lua module is installed and its config checks; else
        says why and skips it (as HAProxy)."""
        def skip(why):
            self.lua_skipped = why
            print(f"warning: Lua peer {why}: Lua peer skipped", file=sys.stderr)
        module = NGINX_MODULES / "ngx_http_lua_module.so"
        if not module.exists():
            return skip(f"not available: {module} is missing (Debian package `libnginx-mod-http-lua`)")
        self.write_lua()
        conf = OUT / "lua" / "nginx.conf"
        def first_error(text):
            lines = [l for l in text.splitlines() if "[emerg]" in l or "[error]" in l or "[alert]" in l]
            return " ".join(lines[0].split())[:300] if lines else None
        # `nginx -t` checks the config, not init_by_lua (a module that fails there stops the start).
        check = subprocess.run(["nginx", "-t", "-q", "-p", str(OUT / "lua"), "-c", str(conf)],
                               capture_output=True, text=True)
        failed = first_error(check.stdout + check.stderr)
        if check.returncode != 0 or failed:
            return skip(f"config check failed: {failed or ' '.join((check.stdout + check.stderr).split())[:300]}")
        log = open(OUT / "lua" / "nginx.log", "w")
        p = subprocess.Popen(PIN["server"] + ["nginx", "-p", str(OUT / "lua"), "-c", str(conf)],
                             stdout=log, stderr=log)
        self.procs.append(p)
        try:
            wait_port(self.lua_port, proc=p)
        except RuntimeError:
            errors = (OUT / "lua" / "error.log").read_text() if (OUT / "lua" / "error.log").exists() else ""
            return skip(f"did not start: {first_error(errors) or 'see benches/out/lua/error.log'}")
        time.sleep(0.3)
        self.lua = p

    def start_nginx(self):
        log = open(OUT / "nginx.log", "w")
        p = subprocess.Popen(PIN["server"] + ["nginx", "-p", str(OUT), "-c", str(OUT / "nginx.conf")],
                             stdout=log, stderr=log)
        self.procs.append(p)
        wait_port(self.nginx_port)
        time.sleep(0.3)
        self.nginx = p

    def stop(self):
        for p in self.procs:
            sig = signal.SIGQUIT
            if p in self.gateways or p is self.floor:
                sig = signal.SIGINT
            elif p is self.redis:
                sig = signal.SIGTERM  # redis-server ignores SIGQUIT (every Redis run waited 10 s)
            elif p is self.haproxy:
                sig = signal.SIGUSR1  # HAProxy's soft stop
            stop_process(p, sig)


def stop_process(p, sig=signal.SIGINT):
    """Stops a server; one that does not exit within 10 s is killed and reported."""
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        command = " ".join(str(a) for a in p.args)
        print(f"warning: pid {p.pid} ({command[:100]}) did not stop within 10 s of {sig.name}; killed",
              file=sys.stderr)
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
# Call logs (`gateway.calls`, on by default) are off in every variant but `calls`, so the other
# ratios keep measuring what they measured before call logs existed.
CALLS_OFF = "  calls: { enabled: false }\n"
COST_VARIANTS = [
    ("baseline", "metrics recording off, access log off, call logs off",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF),
    # The same config again: the A/A ratio is the noise floor of the run.
    ("baseline_again", "the baseline again (A/A: the run's noise)",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF),
    ("metrics", "metrics recording on (the default)", "  admin: { listen: null, metrics: true }\n" + CALLS_OFF),
    ("metrics_log", "metrics on + JSON access log to a file",
     "  admin: { listen: null, metrics: true }\n  access_log: { enabled: true, path: access.log }\n" + CALLS_OFF),
    # The pair for /v1/logs and /v1/stats: the baseline with call logging on (the default store
    # of the run's quota store: SQLite in state/, or Redis with --quota redis).
    ("calls", "the baseline + call logs on (the default)",
     "  admin: { listen: null, metrics: false }\n  calls: { enabled: true }\n"),
    # Verdict changes: `calls` + every lookup's project watched (the call writer hands each
    # tick's lookups to the changes service): against `calls`, the watch's cost.
    ("changes", "`calls` + verdict changes watching the key's plan",
     "  admin: { listen: null, metrics: false }\n  calls: { enabled: true }\n"
     "  changes: { watch_days: { unlimited: 30 } }\n"),
    # Tracing: the baseline + OpenTelemetry spans to a collector on loopback that takes every
    # batch ({sink}: a sink started by the harness), at two sample ratios; and to a collector
    # that is down (a port nobody listens on), where every export fails.
    ("tracing_1", "the baseline + tracing, sample_ratio 1.0, collector up",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF
     + "  tracing: { otlp_endpoint: 'http://127.0.0.1:{sink}', sample_ratio: 1.0 }\n"),
    ("tracing_001", "the baseline + tracing, sample_ratio 0.01, collector up",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF
     + "  tracing: { otlp_endpoint: 'http://127.0.0.1:{sink}', sample_ratio: 0.01 }\n"),
    ("tracing_down", "the baseline + tracing, sample_ratio 1.0, collector down",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF
     + "  tracing: { otlp_endpoint: 'http://127.0.0.1:{dead}', sample_ratio: 1.0 }\n"),
    # A collector that answers 500 to every export: the gateway backs off (1 s, 2 s, ... 60 s)
    # and drops spans where they end meanwhile, instead of encoding and sending every batch.
    ("tracing_500", "the baseline + tracing, sample_ratio 1.0, collector answering 500",
     "  admin: { listen: null, metrics: false }\n" + CALLS_OFF
     + "  tracing: { otlp_endpoint: 'http://127.0.0.1:{failing}', sample_ratio: 1.0 }\n"),
]


def start_trace_sink(status=200):
    """An OTLP/HTTP collector stand-in on loopback: reads each export and answers `status` (200:
    an empty ExportTraceServiceResponse is an empty body). Returns its port."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


# The batch scenario: names per second in batches of these sizes, against single lookups.
BATCH_SIZES = (100, 1000)


def batch_script(n):
    """A wrk script POSTing a batch of `n` listed names (plus the JSON report)."""
    names = ",".join(f'"d{i * 97 % 100_000}.com"' for i in range(n))
    path = OUT / f"batch{n}.lua"
    path.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{{\"domains\":[{names}]}}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
        f'dofile("{ROOT / "benches" / "load" / "report.lua"}")\n')
    return path


def batch_runs(args):
    """Alternating rounds: single lookups on the gateway and on the floor, and batches of
    BATCH_SIZES names on the gateway (its shipped defaults: call logs, metrics, live
    top-domains on); names per second, p99 per request. Replaces the "Batch lookups" section of
    --results."""
    s = Setup(args)
    s.write_gateway()
    try:
        s.start_with_floor()
        auth = (f"Authorization: Bearer {KEY}",)
        lookup = f"/v1/public/domain/{LISTED}"
        G = f"http://127.0.0.1:{s.gw_port}"
        cases = [("lookup", "gateway", G + lookup, auth, None, 1),
                 ("lookup", "floor", f"http://127.0.0.1:{s.floor_ports['lookup']}{lookup}", (), None, 1)]
        for n in BATCH_SIZES:
            cases.append((f"batch{n}", "gateway", G + "/v1/public/domains", (), batch_script(n), n))
        for name, who, url, hdr, script, n in cases:
            status, body = fetch_post(url, script) if script else fetch(url, hdr)
            assert status == 200, f"{name} {who}: {status} {body[:200]}"
        runs = {(c[0], c[1]): [] for c in cases}
        s.stop_gateway()
        warm = argparse.Namespace(**{**vars(args), "duration": 1})
        for rnd in range(args.rounds):
            for name, who, url, hdr, script, n in cases[rnd % len(cases):] + cases[:rnd % len(cases)]:
                # A fresh gateway per measurement: the call logs of a million names a second
                # would otherwise still be written during the next case.
                if who == "gateway":
                    s.start_gateway()
                pid = s.floor.pid if who == "floor" else s.gw.pid
                measure(url, [pid], warm, hdr, script)
                r = measure(url, [pid], args, hdr, script)
                if who == "gateway":
                    s.stop_gateway()
                r["names_per_s"] = r["rps"] * n
                runs[(name, who)].append(r)
                print(f"round {rnd + 1} {name:10} {who:8} {r['rps']:>9.0f} req/s {r['names_per_s']:>10.0f} names/s"
                      f"  p50 {r['p50_us']:>6} us  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                      f"  errors {r['socket_errors'] + r['non2xx']}", flush=True)
    finally:
        s.stop()
    single = runs[("lookup", "gateway")]
    floor = runs[("lookup", "floor")]
    lines = ["## Batch lookups", "",
             f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {stamp()}: "
             f"wrk -t1 -c{args.connections} -d{args.duration}s after a 1 s warm-up, a fresh gateway process for each "
             f"measurement, {args.rounds} rounds in a rotated order, medians; "
             f"the gateway on its shipped defaults (call logs, metrics, live top-domains on), {args.entries} listed "
             f"names, batches of listed names; pinning: {pin_note()}.",
             "", "| case | req/s | names/s | names/s vs single lookups | p50 us | p99 us | cpu us/req | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, who), rs in runs.items():
        lines.append(f"| {name} ({who}) | {med(rs, 'rps'):.0f} | {med(rs, 'names_per_s'):.0f} | "
                     f"**{med(rs, 'names_per_s') / med(single, 'names_per_s'):.1f}x** | {med(rs, 'p50_us'):.0f} | "
                     f"{med(rs, 'p99_us'):.0f} | {med(rs, 'cpu_us_per_req'):.2f} | "
                     f"{sum(r['socket_errors'] + r['non2xx'] for r in rs)} |")
    paired = statistics.median(g["rps"] / f["rps"] for g, f in zip(single, floor))
    paired_p99 = statistics.median(g["p99_us"] / f["p99_us"] for g, f in zip(single, floor))
    lines += ["", f"Single lookups against the bare Pingora floor: throughput **{med(single, 'rps') / med(floor, 'rps'):.2f}x** "
              f"(paired by round {paired:.2f}x; goal >= 0.8x), p99 **{med(single, 'p99_us') / med(floor, 'p99_us'):.2f}x** "
              f"the floor's (paired {paired_p99:.2f}x; goal <= 1.5x).", ""]
    replace_section(args.results, "Batch lookups", "\n".join(lines))


def embed_runs(args):
    """Alternating rounds, a fresh process per measurement: the lookup on the standalone gateway,
    on examples/embed.rs (the same config, the routes mounted in a host proxy) and on the floor;
    and a host route of the example proxied to the upstream beside the floor's bare proxy.
    Replaces the "Embedded" section of --results."""
    assert EMBED.exists(), f"{EMBED} is missing (cargo build --release --example embed)"
    s = Setup(args)
    s.write_gateway(extra="  admin: { listen: null }\n")
    try:
        s.start_with_floor()
        auth = (f"Authorization: Bearer {KEY}",)
        lookup = f"/v1/public/domain/{LISTED}"
        G = f"http://127.0.0.1:{s.gw_port}"
        cases = [("lookup", "gateway", G + lookup, auth),
                 ("lookup", "embed", G + lookup, auth),
                 ("lookup", "floor", f"http://127.0.0.1:{s.floor_ports['lookup']}{lookup}", ()),
                 ("host_route", "embed", G + "/app/page", ()),
                 ("host_route", "floor", f"http://127.0.0.1:{s.floor_ports['proxy']}/app/page", ())]
        s.stop_gateway()
        starts = {"gateway": s.start_gateway, "embed": s.start_embed}
        for name, who, url, hdr in cases:
            if who in starts:
                starts[who]()
            status, body = fetch(url, hdr)
            want = s.lookup_body if name == "lookup" else UPSTREAM_BODY
            assert (status, body) == (200, want), f"{name} {who}: {status} {body[:200]}"
            if who in starts:
                s.stop_gateway()
        runs = {(c[0], c[1]): [] for c in cases}
        warm = argparse.Namespace(**{**vars(args), "duration": 1})
        for rnd in range(args.rounds):
            for name, who, url, hdr in cases[rnd % len(cases):] + cases[:rnd % len(cases)]:
                if who in starts:
                    starts[who]()
                pid = s.floor.pid if who == "floor" else s.gw.pid
                measure(url, [pid], warm, hdr)
                r = measure(url, [pid], args, hdr)
                if who in starts:
                    s.stop_gateway()
                runs[(name, who)].append(r)
                print(f"round {rnd + 1} {name:10} {who:8} {r['rps']:>9.0f} req/s  p50 {r['p50_us']:>6} us"
                      f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                      f"  errors {r['socket_errors'] + r['non2xx']}  wrk cpu {r['client_cpu_share']:.0%}",
                      flush=True)
    finally:
        s.stop()
    lines = ["## Embedded", "",
             f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {stamp()}: "
             f"wrk -t1 -c{args.connections} -d{args.duration}s after a 1 s warm-up, a fresh process for each "
             f"gateway measurement, {args.rounds} rounds in a rotated order, medians; the standalone gateway and "
             f"`examples/embed.rs` (a host proxy with the routes mounted under `/v1/`, the system allocator) on one "
             f"config ({args.entries} listed names, admin listener off); pinning: {pin_note()}.",
             "", "| case | req/s | vs standalone | paired | vs floor | p50 us | p99 us | cpu us/req | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (name, who), rs in runs.items():
        base = runs.get((name, "gateway"))
        floor = runs[(name, "floor")]
        vs = f"{med(rs, 'rps') / med(base, 'rps'):.2f}x" if base else ""
        paired = f"{statistics.median(r['rps'] / b['rps'] for r, b in zip(rs, base)):.2f}x" if base else ""
        lines.append(f"| {name} ({who}) | {med(rs, 'rps'):.0f} | {vs} | {paired} | "
                     f"{med(rs, 'rps') / med(floor, 'rps'):.2f}x | {med(rs, 'p50_us'):.0f} | "
                     f"{med(rs, 'p99_us'):.0f} | {med(rs, 'cpu_us_per_req'):.2f} | "
                     f"{sum(r['socket_errors'] + r['non2xx'] for r in rs)} |")
    lines.append("")
    replace_section(args.results, "Embedded", "\n".join(lines))


def stamp():
    """When and from which commit a section's figures come (`-dirty`: with uncommitted changes)."""
    def git(*cmd):
        return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short=7", "HEAD") or "unknown"
    # Changes to the code measured (not to results, docs or the harness's state files).
    dirty = "-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", "crates", "src",
                            "examples", "Cargo.toml", "Cargo.lock", "build.rs") else ""
    made = f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, commit {commit}{dirty}"
    if os.environ.get("DRG_BIN"):
        # Another build than the tree's: say which (its --version carries its commit).
        out = (subprocess.run([str(BIN), "--version"], capture_output=True, text=True).stdout.strip().splitlines() or [""])[0]
        made += f", gateway binary `{BIN}` ({out or '?'})"
    return made


RESULTS_TITLE = "# Benchmark results"
RESULTS_INTRO = ("Newest first: each section is the newest run of its scenario, with the command, date and "
                 "commit that made it.")


def replace_section(results, title, section):
    """Prints `section` and puts it in place of the `## title` section of the results file, on
    top (the newest figures first)."""
    print(section)
    path = Path(results)
    text = path.read_text() if path.exists() else ""
    text = re.sub(rf"\n## {re.escape(title)}\n.*?(?=\n## |\Z)", "", "\n" + text, flags=re.S)
    first = re.search(r"\n## ", text)
    rest = text[first.start():].strip("\n") if first else ""
    path.write_text("\n\n".join(x for x in (RESULTS_TITLE, RESULTS_INTRO, section.strip("\n"), rest) if x)
                    + "\n")


# The `mix` scenario: traffic as users send it. Shares of the stream, and the requests in each
# measurement's slice of it (more than a 5 s run at 40k req/s asks for).
MIX_SHARES = (("free", 0.55), ("company", 0.30), ("listed", 0.10), ("invalid", 0.05))
MIX_SLICE = 250_000
# Companies a gateway in service has met before the first round: the pool most returning company
# lookups name (a slice's own new names are the rest).
MIX_KNOWN = 5_000
MIX_TLDS = ("com", "net", "io", "de", "co.uk", "fr", "org")
MIX_INVALID = ("not_a_domain", "-bad-.com", "a..b.com", "x" * 70 + ".com", "localhost", "1.2.3")
# Company mail: Google Workspace, Microsoft 365, or the company's own host.
MIX_HOSTS = ("aspmx.l.google.com", "{label}-com.mail.protection.outlook.com", "mx.{name}")


def mix_stream(args, slices, known=0):
    """`slices` lists of lookup paths (a seeded stream of distinct names: free providers, company
    domains that need MX, listed throwaways, invalid names), the DNS zones of the companies, their
    names, and `known` companies to ask before the first slice. A company seen before is drawn from
    those and the companies named earlier in its own slice, never from an earlier slice's tail: how
    much of a slice a round reaches depends on the machine's speed, and names it never reached
    would count as seen yet miss the cache (the mix's hit ratio fell from 86% to 26% on a slow run)."""
    import random
    rng = random.Random(args.seed)
    free = [l.strip() for l in (ROOT / "data" / "free_providers.txt").read_text().splitlines()
            if l.strip() and not l.startswith("#")]
    companies, zones = [], []

    def new_company():
        k = len(companies)
        name = f"co{k}-{rng.randrange(10**6):06d}.{MIX_TLDS[k % len(MIX_TLDS)]}"
        host = MIX_HOSTS[rng.randrange(len(MIX_HOSTS))].format(label=name.split(".")[0], name=name)
        companies.append(name)
        zones.append(f"{name} {args.dns_ttl} {host}")
        return name

    for _ in range(known):
        new_company()
    pool = companies[:known]
    out = []
    for _ in range(slices):
        paths, seen = [], list(pool)
        for _ in range(MIX_SLICE):
            r, kind = rng.random(), "invalid"
            for k, share in MIX_SHARES:
                if r < share:
                    kind = k
                    break
                r -= share
            if kind == "free":
                name = rng.choice(free)
            elif kind == "company":
                reuse = seen and rng.random() < args.mix_repeat
                name = rng.choice(seen) if reuse else new_company()
                if not reuse:
                    seen.append(name)
            elif kind == "listed":
                name = f"d{rng.randrange(args.entries)}.com"
            else:
                name = rng.choice(MIX_INVALID)
            paths.append(f"/v1/public/domain/{name}")
        out.append(paths)
    return out, zones, set(companies), pool


def mix_warm(port, names):
    """Asks the gateway each of `names` once (64 at a time, outside any measurement), as a gateway
    in service has met the companies that come back; each must answer 200."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(name):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/public/domain/{name}",
                                     headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status

    with ThreadPoolExecutor(64) as pool:
        bad = [s for s in pool.map(ask, names) if s != 200]
    if bad:
        sys.exit(f"mix warm-up: {len(bad)} of {len(names)} known companies did not answer 200")


def mix_script(paths, tag, auth, delay_ms=0):
    """A wrk script walking `paths` in order (one thread), with the JSON report; with `delay_ms`
    each connection waits that long after an answer before its next request (a paced rate)."""
    listing = OUT / f"mix-{tag}.txt"
    listing.write_text("\n".join(paths) + "\n")
    path = OUT / f"mix-{tag}.lua"
    header = f'wrk.headers["Authorization"] = "Bearer {KEY}"\n' if auth else ""
    path.write_text(
        "local paths = {}\n"
        f'for line in io.lines("{listing}") do paths[#paths + 1] = line end\n'
        "local i = 0\n" + header +
        "request = function()\n  i = i + 1\n  if i > #paths then i = 1 end\n"
        "  return wrk.format(nil, paths[i])\nend\n"
        + (f"delay = function() return {delay_ms} end\n" if delay_ms else "") +
        f'dofile("{ROOT / "benches" / "load" / "report.lua"}")\n')
    return path


def admin_metrics(port):
    """The admin listener's samples, `name{labels}` -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def mix_runs(args):
    """Traffic as users send it (`--only mix`): a seeded stream of distinct names against the
    gateway with MX on, resolving through a DNS server on loopback that answers after
    --dns-latency-ms, beside the floor answering a lookup's bytes. Reports req/s, p50/p99, the MX
    cache's hit ratio and the DNS queries sent per distinct company name. Replaces the
    "Realistic mix" section of --results."""
    if not DNS.exists():
        sys.exit(f"{DNS} is missing: cargo build --release --example dns_loopback")
    s = Setup(args)  # first: it empties OUT
    # One slice more than rounds: the probe's round (--breakdown) meets names no round asked.
    stream, zones, companies, known = mix_stream(args, args.rounds + 1, MIX_KNOWN)
    delay_ms = round(args.connections * 1000 / args.rate) if args.rate else 0
    (OUT / "zones.txt").write_text("\n".join(zones) + "\n")
    counts = OUT / "dns-counts.json"
    dns_log = open(OUT / "dns.log", "w")
    dns = subprocess.Popen(PIN["backend"] + [str(DNS), "--zones", str(OUT / "zones.txt"),
                                             "--delay-ms", str(args.dns_latency_ms), "--counts", str(counts)]
                           + ([] if args.dns_glue == "on" else ["--no-glue"]),
                           stdout=subprocess.PIPE, stderr=dns_log, text=True)
    dns_addr = dns.stdout.readline().split()[-1]
    s.procs.append(dns)
    admin = free_port()
    s.write_gateway(extra=f"  admin: {{ listen: '127.0.0.1:{admin}' }}\n",
                    mx=(f"{{ servers: ['{dns_addr}'], neighbourhood: {{ enabled: {args.neighbourhood == 'on'}"
                        + ("" if args.learn_per_second is None else f", learn_per_second: {args.learn_per_second}")
                        + " } }").lower())
    auth = (f"Authorization: Bearer {KEY}",)
    runs = {"gateway": [], "floor": [], "lua": []}
    try:
        s.start_with_floor()
        if not args.no_lua:
            # The Lua peer answers the same stream from the same table, without MX (it has none).
            s.start_lua()
        wait_port(admin)
        mix_warm(s.gw_port, known)
        floor_url = f"http://127.0.0.1:{s.floor_ports['lookup']}/"
        servers = [("gateway", f"http://127.0.0.1:{s.gw_port}/"), ("floor", floor_url)]
        if s.lua:
            servers.append(("lua", f"http://127.0.0.1:{s.lua_port}/"))
        pids = {"gateway": lambda: [s.gw.pid], "floor": lambda: [s.floor.pid],
                "lua": lambda: [s.lua.pid] + children(s.lua.pid)}
        for rnd in range(args.rounds):
            # Every server once a round, the order rotated each round.
            order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
            for who, url in order:
                script = mix_script(stream[rnd], f"{rnd}-{who}", auth=(who != "floor"), delay_ms=delay_ms)
                before = admin_metrics(admin) if who == "gateway" else {}
                r = measure(url, pids[who](), args, (), script)
                if who == "gateway":
                    after = admin_metrics(admin)
                    d = lambda k: after.get(k, 0) - before.get(k, 0)
                    hits, misses = d("drg_mx_cache_hits_total"), d("drg_mx_cache_misses_total")
                    r["mx_hit_ratio"] = hits / max(hits + misses, 1)
                    r["mx_lookups_per_req"] = (hits + misses) / max(r["requests"], 1)
                    r["invalid_share"] = r["non2xx"] / max(r["requests"], 1)
                runs[who].append(r)
                extra = (f"  mx hits {r['mx_hit_ratio']:.1%}  422s {r['invalid_share']:.1%}"
                         if who == "gateway" else "")
                print(f"round {rnd + 1} mix {who:8} {r['rps']:>9.0f} req/s  p50 {r['p50_us']:>6} us"
                      f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req{extra}"
                      f"  server cpu {r['server_cpu_share']:.0%}  wrk cpu {r['client_cpu_share']:.0%}", flush=True)
        probed = {}
        if args.breakdown:
            # A round a server under `perf stat`, outside the medians: counting costs a little.
            for who, url in servers:
                script = mix_script(stream[-1], f"probe-{who}", auth=(who != "floor"), delay_ms=delay_ms)
                probe = breakdown.Probe(pids[who]())
                r = wrk(url, args, (), script)
                probed[who] = probe.finish(r["requests"])
                probed[who]["rps"] = r["rps"]
                print(f"probe mix {who:8} {r['rps']:>9.0f} req/s  "
                      f"{probed[who]['per_req'].get('syscalls', 0):.2f} syscalls/req", flush=True)
        time.sleep(1.5)  # the DNS server writes its counts every second
        dns_counts = json.loads(counts.read_text())
        queried = {n: c for n, c in dns_counts["mx_queries"].items() if n in companies}
        totals = dns_counts.get("totals", {})
    finally:
        s.stop()
    g, f, lu = runs["gateway"], runs["floor"], runs["lua"]
    per_name = sum(queried.values()) / max(len(queried), 1)
    most = max(queried.values(), default=0)
    ratio = med(g, "rps") / med(f, "rps")
    by_round = [a["rps"] / b["rps"] for a, b in zip(g, f)]
    paired = statistics.median(by_round)
    # The p99 line: the floor's p99 times 1.3, plus the round trip the world adds (a miss
    # waits for DNS once), each round against its own floor.
    p99_lines = [b["p99_us"] * 1.3 + args.dns_latency_ms * 1000 for b in f]
    p99_held = sum(a["p99_us"] <= line for a, line in zip(g, p99_lines))
    if lu:
        ratio_lua = med(g, "rps") / med(lu, "rps")
        by_round_lua = [a["rps"] / b["rps"] for a, b in zip(g, lu)]
        paired_lua = statistics.median(by_round_lua)
    lines = ["## Realistic mix (`--only mix`)", "",
             f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {stamp()}: "
             f"wrk -t1 -c{args.connections} -d{args.duration}s, {args.rounds} rounds, medians with their range "
             f"over the rounds; pinning: {pin_note()}. "
             f"A seeded stream (seed {args.seed}) of lookups: 55% free providers, 30% company domains "
             f"({args.mix_repeat:.0%} of them seen before: one of {MIX_KNOWN} companies asked once before "
             f"the first round, or one named earlier in the round's slice), 10% listed throwaways, 5% invalid "
             f"names; MX on, "
             f"through a DNS server on loopback answering {args.dns_latency_ms} ms after each query, TTL "
             f"{args.dns_ttl} s, "
             + ("its MX answers carrying the hosts' addresses it knows (RFC 1035 additional section)"
                if args.dns_glue == "on" else "its MX answers minimal (no additional section: `--dns-glue off`)")
             + f"; one gateway for all rounds (its MX cache kept), a fresh slice of the stream per "
             f"round; the floor answers a lookup's bytes to every path.", "",
             "| server | req/s | p50 us | p99 us | cpu us/req | server cpu | wrk cpu | MX cache hits | 422s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| gateway | {spread(r['rps'] for r in g)} | {med(g, 'p50_us'):.0f} | {spread(r['p99_us'] for r in g)} | "
             f"{spread((r['cpu_us_per_req'] for r in g), '.2f')} | {med(g, 'server_cpu_share'):.0%} | "
             f"{med(g, 'client_cpu_share'):.0%} | {med(g, 'mx_hit_ratio'):.1%} | {med(g, 'invalid_share'):.1%} |",
             f"| floor | {spread(r['rps'] for r in f)} | {med(f, 'p50_us'):.0f} | {spread(r['p99_us'] for r in f)} | "
             f"{spread((r['cpu_us_per_req'] for r in f), '.2f')} | {med(f, 'server_cpu_share'):.0%} | "
             f"{med(f, 'client_cpu_share'):.0%} | | |"]
    if lu:
        lines.append(
            f"| Lua peer | {spread(r['rps'] for r in lu)} | {med(lu, 'p50_us'):.0f} | {spread(r['p99_us'] for r in lu)} | "
            f"{spread((r['cpu_us_per_req'] for r in lu), '.2f')} | {med(lu, 'server_cpu_share'):.0%} | "
            f"{med(lu, 'client_cpu_share'):.0%} | (no MX) | "
            f"{med(lu, 'non2xx') / max(med(lu, 'requests'), 1):.1%} |")
    lines += ["",
             "server cpu: the server's CPU over a round, a share of one core (its core: servers are pinned "
             "to one); under 100% it waited on the client or on DNS, so its req/s was not its capacity and "
             "the throughput ratio is not the CPU ratio's inverse. wrk cpu: the load generator's own CPU "
             "over a round, a share of its one core (near 100%: the client set the pace).", "",
             f"Throughput **{ratio:.2f}x** the floor (paired by round {paired:.2f}x, "
             f"{min(by_round):.2f}x-{max(by_round):.2f}x; goal >= 0.7x). p99 **{med(g, 'p99_us') / 1000:.1f} ms** "
             f"against the line of 1.3 times the floor's plus the DNS latency, {statistics.median(p99_lines) / 1000:.1f} ms "
             f"(within it in {p99_held} of {len(g)} rounds, each against its own floor). "
             f"DNS: {sum(queried.values())} MX queries for {len(queried)} distinct company names, "
             f"**{per_name:.2f} per name** (most for one name: {most}; goal: 1 per TTL, concurrent lookups of "
             f"a name coalesced). p99 {med(g, 'p99_us') / 1000:.1f} ms against a DNS latency of "
             f"{args.dns_latency_ms} ms (a miss waits for DNS, up to mx.budget_ms). "
             + (f"Against the Lua peer (the same stream and table, no MX): **{ratio_lua:.2f}x** its req/s "
                f"(paired by round {paired_lua:.2f}x, {min(by_round_lua):.2f}x-{max(by_round_lua):.2f}x). "
                if lu else f"The Lua peer was not run ({s.lua_skipped or '--no-lua'}). ")
             + "All queries the server "
             f"received: " + ", ".join(f"{t} {n}" for t, n in totals.items())
             + f" ({sum(totals.values()) / max(len(queried), 1):.2f} a distinct company name, the listed names "
             f"learned in the background counted too).", ""]
    if args.rate:
        lines[2] = lines[2].replace("wrk -t1", f"paced at {args.rate} req/s offered (each connection waits "
                                    f"{delay_ms} ms after an answer), wrk -t1")
    if probed:
        lines += ["Where the CPU goes beyond instructions (`--breakdown`: one more round a server under "
                  "`perf stat --per-thread`, outside the medians; a request, over that round):", ""]
        lines += breakdown.table(probed) + [""]
        lines += ["The gateway's threads:", ""] + breakdown.thread_table(probed["gateway"]) + [""]
    replace_section(args.results, "Realistic mix (`--only mix`)", "\n".join(lines))
    if args.cpu_check and cpu_check(args.cpu_check, {"mix": g}, {"mix": f}):
        sys.exit("cpu a request over its line: mix")


def fetch_post(url, script):
    """(status, body) of the POST a batch script sends."""
    text = Path(script).read_text()
    body = re.search(r"wrk.body = '(.*)'", text).group(1).encode()
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", f"Bearer {KEY}")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def feature_costs(args):
    """Alternating rounds of the lookup scenario over the cost variants; medians; ratios to the
    baseline measured in the same run. Replaces the "Feature costs" section of --results."""
    s = Setup(args)
    ports = {}
    sink, dead, failing = start_trace_sink(), free_port(), start_trace_sink(500)
    try:
        for name, _, extra in COST_VARIANTS:
            ports[name] = free_port()
            extra = (extra.replace("{sink}", str(sink)).replace("{dead}", str(dead))
                     .replace("{failing}", str(failing)))
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
                s.stop_gateway()
                runs[name].append(r)
                print(f"round {rnd + 1} {name:14} {r['rps']:>10.0f} req/s  p50 {r['p50_us']:>6} us"
                      f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                      f"  errors {r['socket_errors'] + r['non2xx']}", flush=True)
        log_lines = sum(1 for _ in open(OUT / "access.log")) if (OUT / "access.log").exists() else 0
    finally:
        s.stop()
    base = runs["baseline"]
    lines = ["## Feature costs", "",
             f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {stamp()}: "
             f"the lookup scenario (wrk -t1 -c{args.connections} -d{args.duration}s) on gateways that differ only by "
             f"the feature, {args.rounds} rotating rounds (a fresh gateway process for each measurement, after a 1 s warm-up), "
             f"medians; ratio = req/s against the baseline of the same run. "
             f"Pinning: {pin_note()} (all of a gateway's threads, the access-log writer included).",
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
    replace_section(args.results, "Feature costs", "\n".join(lines))


def wrk(url, args, headers=(), script=None):
    cmd = PIN["wrk"] + ["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s", "--timeout", "5s",
           "-s", str(script or ROOT / "benches" / "load" / "report.lua")]
    for h in headers:
        cmd += ["-H", h]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=args.duration + 30).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    line = [l for l in out.splitlines() if l.startswith("{")][-1]
    r = json.loads(line)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    # wrk's own CPU over the run, as a share of its one core: near 100%, the client, not the
    # server, set the pace (and a slower server leaves wrk idle, waking it for each answer).
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    r["client_cpu_share"] = spent / max(r["duration_us"] / 1e6, 1e-9)
    return r


def measure(url, pids, args, headers=(), script=None):
    before = cpu_seconds(pids)
    r = wrk(url, args, headers, script)
    r["cpu_us_per_req"] = (cpu_seconds(pids) - before) * 1e6 / max(r["requests"], 1)
    # The server's CPU over the run as a share of one core (its core when pinned): under 100%,
    # it waited on the client or on DNS, and its req/s is not its capacity.
    r["server_cpu_share"] = r["cpu_us_per_req"] * r["rps"] / 1e6
    return r


SERVERS = ("gateway", "nginx", "floor", "haproxy", "lua")


def cpu_check(path, gateway_runs, floor_runs):
    """The CPU yardstick (`--cpu-check LIMITS`): per scenario, the median over rounds of the
    gateway's CPU a request over the floor's in the same round, against its line in LIMITS
    (`scenario ratio` lines). Prints each and returns the scenarios over their line."""
    limits = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].split()
        if len(line) == 2:
            limits[line[0]] = float(line[1])
    over = []
    for name, g in gateway_runs.items():
        f = floor_runs.get(name) or []
        if name not in limits or not f:
            continue
        ratio = statistics.median(a["cpu_us_per_req"] / b["cpu_us_per_req"] for a, b in zip(g, f))
        held = ratio <= limits[name]
        print(f"cpu a request {name:8} gateway/floor {ratio:.2f}x (line {limits[name]:.2f}x): "
              f"{'held' if held else 'OVER'}", flush=True)
        if not held:
            over.append(name)
    return over


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--duration", type=int, default=5)
    # Five at least: a median and its range over five paired rounds is what a figure is quoted as.
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--work-stealing", action="store_true", help="Pingora's work-stealing runtime")
    ap.add_argument("--only", default="", help="comma-separated scenario names, or memory, costs, batch, embed, "
                                               "mix, look, scaling or bigtable")
    ap.add_argument("--batch-max", type=int, default=1000,
                    help="--quota redis-batched: the lease size (quota.redis.batch_max); 1000 as "
                         "docs/scaling.md sizes it for the one key's ~75,000 calls a second (with "
                         "leases of 100, ~60%% of calls waited for the next lease)")
    ap.add_argument("--quota", default="local", choices=["local", "redis", "redis-batched"],
                    help="the gateway's quota store (redis-server is started by the harness)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="servers under test on core 0 (cores 0..workers-1), wrk and the backends on the "
                         "next core (taskset); on by default, --no-pin to switch off")
    ap.add_argument("--no-floor", action="store_true", help="leave out the bare Pingora floor")
    ap.add_argument("--no-haproxy", action="store_true", help="leave out HAProxy")
    ap.add_argument("--no-lua", action="store_true", help="leave out the Lua peer (nginx + Lua)")
    ap.add_argument("--storm-interval-ms", type=int, default=500,
                    help="reload storm: the table file is replaced this often; a build that sees its file "
                         "change while it runs is discarded, so shorter than a build publishes nothing")
    ap.add_argument("--build-priority", choices=["low", "idle"], default="low",
                    help="the gateway's reload.build_priority (the reload storm's lever)")
    ap.add_argument("--upstream-mode", choices=["proxy", "relay"], default=None,
                    help="the gateway's gateway.upstream.mode for /v1/check (default: the gateway's own)")
    ap.add_argument("--results", default=str(ROOT / "benches" / "RESULTS.md"))
    ap.add_argument("--calls", choices=["on", "off"], default="on",
                    help="the gateway's call logs (on as shipped; with --quota redis* they go to Redis)")
    ap.add_argument("--rdap", choices=["on", "off"], default="on",
                    help="the gateway's RDAP domain-age lookups (on as shipped, with no registry to ask)")
    ap.add_argument("--seed", type=int, default=42, help="mix: the stream's seed")
    ap.add_argument("--learn-per-second", type=int, default=None,
                    help="mix: mx.neighbourhood.learn_per_second (default: the gateway's; 0: no bound)")
    ap.add_argument("--neighbourhood", choices=["on", "off"], default="on",
                    help="mix: the MX neighbourhood (on as shipped: listed names resolved in the background)")
    ap.add_argument("--dns-latency-ms", type=int, default=20, help="mix: the loopback DNS server's latency")
    ap.add_argument("--dns-ttl", type=int, default=300, help="mix: the companies' MX TTL (seconds)")
    ap.add_argument("--dns-glue", choices=("on", "off"), default="on",
                    help="mix: whether the DNS server's MX answers carry the hosts' addresses")
    ap.add_argument("--rate", type=int, default=0,
                    help="mix: pace every server to about this many requests a second (each connection "
                         "waits connections/rate after an answer); 0: as fast as each answers")
    ap.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=True,
                    help="mix: one more round a server under perf stat (syscalls, switches, wake-ups, "
                         "CPU by thread), outside the medians")
    ap.add_argument("--cpu-check", default=None, metavar="LIMITS",
                    help="exit 1 when a scenario's gateway/floor CPU a request (median of paired rounds) "
                         "is over its line in LIMITS (benches/load/cpu-limits)")
    ap.add_argument("--look-hosts", type=int, default=40,
                    help="look: the shared throwaway mail hosts the listed names are spread over")
    ap.add_argument("--look-lapsed", type=float, default=0.3,
                    help="look: the share of listed names lapsed (NXDOMAIN)")
    ap.add_argument("--look-max-rate", type=int, default=None,
                    help="look: mx.neighbourhood.look.max_rate (default: as shipped)")
    ap.add_argument("--look-concurrency", type=int, default=None,
                    help="look: mx.neighbourhood.look.concurrency (default: as shipped)")
    ap.add_argument("--look-timeout", type=int, default=600, help="look: seconds to wait for the first pass")
    ap.add_argument("--look-registry", action="store_true",
                    help="look: an RDAP registry on loopback dates every name (listed names over a year "
                         "old, the asked throwaways days old), at the shipped pace; its own section")
    ap.add_argument("--look-probes", type=int, default=100,
                    help="look: unlisted throwaways asked fresh at 1, 2 and 5 minutes (recall)")
    ap.add_argument("--mix-repeat", type=float, default=0.9,
                    help="mix: the share of company lookups naming a company seen before")
    args = ap.parse_args()
    pin(args)
    if args.only == "memory":
        return memory_only(args)
    if args.only == "costs":
        return feature_costs(args)
    if args.only == "batch":
        return batch_runs(args)
    if args.only == "embed":
        return embed_runs(args)
    if args.only == "mix":
        return mix_runs(args)
    if args.only == "scaling":
        sys.path.insert(0, str(Path(__file__).parent))
        import scaling
        return scaling.run(args, sys.modules[__name__])
    if args.only == "look":
        import first_look
        return first_look.run(args, sys.modules[__name__])
    if args.only == "bigtable":
        sys.path.insert(0, str(Path(__file__).parent))
        import bigtable
        return bigtable.run(args, sys.modules[__name__])

    s = Setup(args)
    s.write_gateway()
    try:
        s.start_upstream()
        gw_start = s.start_gateway()
        s.bodies()
        if not args.no_lua:
            s.refusals()
        s.write_nginx()
        s.start_nginx()
        if args.no_floor:
            print("note: --no-floor: the bare Pingora floor is left out", file=sys.stderr)
        elif not FLOOR.exists():
            print(f"note: {FLOOR} is missing (cargo build --release --example floor): floor skipped",
                  file=sys.stderr)
        else:
            s.start_floor()
        if args.no_haproxy:
            s.haproxy_skipped = "left out (--no-haproxy)"
        else:
            s.start_haproxy()
        if args.no_lua:
            s.lua_skipped = "left out (--no-lua)"
        else:
            s.start_lua()
        auth = (f"Authorization: Bearer {KEY}",)
        G = f"http://127.0.0.1:{s.gw_port}"
        N = f"http://127.0.0.1:{s.nginx_port}"
        H = f"http://127.0.0.1:{getattr(s, 'haproxy_port', 0)}"
        Lu = f"http://127.0.0.1:{getattr(s, 'lua_port', 0)}"
        F = {k: f"http://127.0.0.1:{p}" for k, p in getattr(s, "floor_ports", {}).items()}
        lookup = f"/v1/public/domain/{LISTED}"
        check = "/v1/check/user%40example.com"
        # Per scenario, per server: (url, headers, expected status, expected body). HAProxy and
        # the Lua peer always do the job (key, count, table); the floor answers the same bytes
        # with no logic; nginx as described.
        scenarios = [
            ("lookup", "lookup of a listed domain (auth, origin, quota on) vs nginx `return 200` of the same body",
             {"gateway": (G + lookup, auth), "nginx": (N + "/static/lookup", ()),
              "floor": (F.get("lookup", "") + lookup, ()), "haproxy": (H + lookup, auth),
              "lua": (Lu + lookup, auth)},
             (200, s.lookup_body)),
            ("lookup_same_job", "the same lookup vs nginx doing the job: `map` of the table to bodies + `map` on the key",
             {"gateway": (G + lookup, auth), "nginx": (N + lookup, auth),
              "floor": (F.get("lookup", "") + lookup, ()), "haproxy": (H + lookup, auth),
              "lua": (Lu + lookup, auth)},
             (200, s.lookup_body)),
            ("unauthorized", "rejected request (401, connection kept) vs nginx `return 401`",
             {"gateway": (G + lookup, ()), "nginx": (N + "/static/unauthorized", ()),
              "floor": (F.get("unauthorized", "") + lookup, ()), "haproxy": (H + lookup, ()),
              "lua": (Lu + lookup, ())},
             (401, s.unauth_body)),
            ("top_domains", "/v1/public/top-domains (100 entries) vs nginx serving the same body from a file (too long for `return`)",
             {"gateway": (G + "/v1/public/top-domains", auth), "nginx": (N + "/static/top", ()),
              "floor": (F.get("top", "") + "/v1/public/top-domains", ()),
              "haproxy": (H + "/v1/public/top-domains", auth), "lua": (Lu + "/v1/public/top-domains", auth)},
             (200, s.top_body)),
            ("check_proxied", "/v1/check proxied to a local upstream vs nginx `proxy_pass` (keepalive) to it; "
             "floor: a bare Pingora `ProxyHttp` to the same upstream",
             {"gateway": (G + check, auth), "nginx": (N + check, auth),
              "floor": (F.get("proxy", "") + check, auth), "haproxy": (H + check, auth),
              "lua": (Lu + check, auth)},
             (200, UPSTREAM_BODY)),
        ]
        pids = {"gateway": lambda: [s.gw.pid],
                "nginx": lambda: [s.nginx.pid] + children(s.nginx.pid),
                "floor": lambda: [s.floor.pid],
                "haproxy": lambda: [s.haproxy.pid] + children(s.haproxy.pid),
                "lua": lambda: [s.lua.pid] + children(s.lua.pid)}
        present = [w for w in SERVERS if {"floor": s.floor, "haproxy": s.haproxy, "lua": s.lua}.get(w, True)]
        only = set(filter(None, args.only.split(",")))
        scenarios = [sc for sc in scenarios if not only or sc[0] in only]
        present = verify(s, scenarios, present)
        runs = {name: {w: [] for w in present} for name, *_ in scenarios}
        for rnd in range(args.rounds):
            for name, _, targets, _ in scenarios:
                # Every server once per round, the order rotated each round.
                order = present[rnd % len(present):] + present[:rnd % len(present)]
                for who in order:
                    url, hdr = targets[who]
                    before = s.upstream_accepts() if name == "check_proxied" else 0
                    r = measure(url, pids[who](), args, hdr)
                    if name == "check_proxied":
                        r["upstream_conns"] = s.upstream_accepts() - before
                    runs[name][who].append(r)
                    conns = f"  upstream conns {r['upstream_conns']}" if "upstream_conns" in r else ""
                    print(f"round {rnd + 1} {name:16} {who:8} {r['rps']:>10.0f} req/s  p50 {r['p50_us']:>6} us"
                          f"  p99 {r['p99_us']:>6} us  cpu {r['cpu_us_per_req']:.2f} us/req"
                          f"  errors {r['socket_errors']}{conns}  wrk cpu {r['client_cpu_share']:.0%}",
                          flush=True)
        over = []
        if args.cpu_check:
            over = cpu_check(args.cpu_check, {n: r["gateway"] for n, r in runs.items()},
                             {n: r.get("floor", []) for n, r in runs.items()})
        storm = None
        if not only or "reload_storm" in only:
            storm = reload_storm(s, args, G + lookup, auth)
        mem = memory(s, args, gw_start)
    finally:
        s.stop()
    report(args, scenarios, runs, storm, mem, s.haproxy_skipped, s.lua_skipped)
    if over:
        sys.exit(f"cpu a request over its line: {', '.join(over)}")


def fetch(url, headers=()):
    """(status, body) of one GET."""
    req = urllib.request.Request(url)
    for h in headers:
        name, value = h.split(": ", 1)
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def fetch_full(url, headers=()):
    """(status, headers with lowercase names, body) of one GET."""
    req = urllib.request.Request(url)
    for h in headers:
        name, value = h.split(": ", 1)
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read().decode()


# The headers of the gateway's answers the Lua peer must send alike (the seconds to the month's
# reset, `t=` and Retry-After, may differ by the second or two between the two requests).
LUA_HEADERS = ("content-type", "www-authenticate", "retry-after", "ratelimit-policy", "ratelimit",
               "vary", "access-control-allow-origin", "access-control-expose-headers", "allow")


def same_answer(want, got, headers=LUA_HEADERS, drift=0.0):
    """None when `got` (status, headers, body) answers as `want` does, else how it differs.
    Time-dependent header values (`Retry-After`, RateLimit's `t=`: seconds to a reset) may
    differ by the seconds between the two answers (`drift`, measured by the caller) and one for
    the rounding of each; any other difference is a real mismatch."""
    if (want[0], want[2]) != (got[0], got[2]):
        return f"{got[0]} {got[2][:120]!r}, expected {want[0]} {want[2][:120]!r}"
    allowed = int(drift) + 2
    for h in headers:
        a, b = want[1].get(h), got[1].get(h)
        if a is not None and b is not None and h in ("retry-after", "ratelimit"):
            seconds = lambda v: re.findall(r"(?:^|;t=)(\d+)$", v)
            sa, sb = seconds(a), seconds(b)
            if sa and sb and abs(int(sa[0]) - int(sb[0])) <= allowed:
                a, b = a[:-len(sa[0])], b[:-len(sb[0])]
        if a != b:
            return f"header {h}: {b!r}, expected {a!r} (time-dependent values within {allowed} s)"
    return None


def lua_problems(s):
    """The Lua peer against the gateway beyond the scenarios: the refusals (status, headers,
    body), lookups of each kind of name the lists answer (free provider, unlisted, invalid;
    checked on both servers: none of them enters the gateway's top-domains), a subdomain of a
    listed name (the gateway's `disposable_subdomain` score, 95: asking the gateway would put it
    in its top-domains), and top-domains with a limit."""
    L = f"http://127.0.0.1:{s.lua_port}"
    G = f"http://127.0.0.1:{s.gw_port}"
    lookup = f"/v1/public/domain/{LISTED}"
    auth = (f"Authorization: Bearer {KEY}",)
    asked = {
        "wrong key": (lookup, ("Authorization: Bearer drg_not_a_key",)),
        "other origin": (lookup, (f"Authorization: Bearer {BROWSER_KEY}", "Origin: https://elsewhere.example")),
        "no origin": (lookup, (f"Authorization: Bearer {BROWSER_KEY}",)),
        "own origin": (lookup, (f"Authorization: Bearer {BROWSER_KEY}", f"Origin: {BROWSER_ORIGIN}")),
    }
    for i in range(LIMITED_CALLS + 1):
        asked[f"limited key, call {i + 1}"] = (lookup, (f"Authorization: Bearer {LIMITED_KEY}",))
    problems = []
    for what, (path, hdr) in asked.items():
        wrong = same_answer(s.refused[what], fetch_full(L + path, hdr),
                            drift=time.monotonic() - s.refused_at)
        if wrong:
            problems.append(f"{what}: {wrong}")
    # The month's count of the bench key differs (the gateway served more calls): RateLimit's
    # `r=` is left out of these.
    same_but_count = tuple(h for h in LUA_HEADERS if h != "ratelimit")
    names = ["gmail.com", "Mail.Gmail.COM.", "example.org", "a%20b.com", "u@x.com", "a%5Cb.com", ""]
    names += [n for n in MIX_INVALID]
    for name in names:
        path = f"/v1/public/domain/{name}"
        wrong = same_answer(fetch_full(G + path, auth), fetch_full(L + path, auth), same_but_count)
        if wrong:
            problems.append(f"{path}: {wrong}")
    sub = f"x.{LISTED}"
    want = s.lookup_body.replace(f'"{LISTED}"', f'"{sub}"').replace('"risk_score":100', '"risk_score":95')
    got = fetch(L + f"/v1/public/domain/{sub}", auth)
    if got != (200, want):
        problems.append(f"{sub}: {got[0]} {got[1][:120]!r}, expected 200 {want[:120]!r}")
    for path in ("/v1/public/top-domains?limit=2", "/v1/public/top-domains?limit=0"):
        wrong = same_answer(fetch_full(G + path, auth), fetch_full(L + path, auth), same_but_count)
        if wrong:
            problems.append(f"{path}: {wrong}")
    return problems


def verify(s, scenarios, present):
    """Every server's answer to every scenario (status and body) before measuring, HAProxy's
    key and quota handling, and the Lua peer's refusals and lookups against the gateway's
    (`lua_problems`). A wrong gateway, nginx or floor stops the run; a wrong HAProxy or Lua peer
    is left out with the reason (its config is ours, the run should not die on it)."""
    problems = {}
    for name, _, targets, (status, body) in scenarios:
        for who in present:
            url, hdr = targets[who]
            got = fetch(url, hdr)
            if got != (status, body):
                problems.setdefault(who, []).append(
                    f"{name}: {url} answered {got[0]} {got[1][:120]!r}, expected {status} {body[:120]!r}")
    if "haproxy" in present:
        url = f"http://127.0.0.1:{s.haproxy_port}/v1/public/domain/d1.com"
        expected = s.lookup_body.replace(LISTED, "d1.com")
        wrong = fetch(url, ("Authorization: Bearer drg_not_a_key",))
        if wrong != (401, s.unauth_body):
            problems.setdefault("haproxy", []).append(f"a wrong key got {wrong[0]}, expected 401")
        got = [fetch(url, (f"Authorization: Bearer {LIMITED_KEY}",)) for _ in range(LIMITED_CALLS + 1)]
        if got[:-1] != [(200, expected)] * LIMITED_CALLS or got[-1][0] != 429:
            problems.setdefault("haproxy", []).append(
                f"a key limited to {LIMITED_CALLS} calls got {[g[0] for g in got]}, "
                f"expected {[200] * LIMITED_CALLS + [429]}")
    if "lua" in present:
        problems.setdefault("lua", []).extend(lua_problems(s))
        if not problems["lua"]:
            del problems["lua"]
    for who, lines in problems.items():
        msg = f"{who} does not answer like the gateway:\n  " + "\n  ".join(lines)
        if who not in ("haproxy", "lua"):
            raise RuntimeError(msg)
        print(f"warning: {msg}\n{LABEL[who]} left out of this run", file=sys.stderr)
        setattr(s, f"{who}_skipped", "its answers did not match: " + "; ".join(lines))
        present = [w for w in present if w != who]
    print(f"checked: {', '.join(present)} answer every scenario with the gateway's status and body", flush=True)
    return present


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
            time.sleep(args.storm_interval_ms / 1000)
    t = threading.Thread(target=storm)
    published_before = (OUT / "gateway.log").read_text().count("domain table reloaded")
    t.start()
    try:
        stormy = [measure(url, [s.gw.pid], args, auth) for _ in range(args.rounds)]
    finally:
        stop.set()
        t.join()
    log = (OUT / "gateway.log").read_text()
    published = log.count("domain table reloaded") - published_before
    for r in steady + stormy:
        print(f"reload_storm {'':8} {r['rps']:>10.0f} req/s p99 {r['p99_us']} us p99.99 {r['p9999_us']} us errors {r['socket_errors'] + r['non2xx']}")
    return {"steady": steady, "storm": stormy, "writes": swaps[0], "published": published,
            "log_errors": log.count("reload failed")}


def memory(s, args, gw_start):
    rss_n = rss_kib(s.gw.pid)
    s.stop()
    s.procs = []
    # The shipped defaults: built-in list + data/.
    p = subprocess.Popen([str(BIN), "-c", str(ROOT / "conf" / "gateway.yaml"), "serve", "--listen",
                          f"127.0.0.1:{free_port()}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "RUST_LOG": "warn"}, cwd=ROOT)
    time.sleep(2.0)
    # The shipped config listens on fixed ports (admin 9180): on a busy box it may not start.
    rss_default = rss_kib(p.pid) if p.poll() is None else None
    stop_process(p)
    shutil.rmtree(ROOT / "state", ignore_errors=True)
    return {"rss_default_kib": rss_default, "rss_entries_kib": rss_n, "start_seconds": gw_start}


def lua_module_version():
    """The installed Debian package of nginx's Lua module, e.g. `libnginx-mod-http-lua 1:0.10.23-1`."""
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "libnginx-mod-http-lua"],
                             capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return f"libnginx-mod-http-lua {out.stdout.strip()}" if out.returncode == 0 and out.stdout.strip() else None


def med(rs, key):
    return statistics.median(r[key] for r in rs)


def spread(values, fmt=".0f"):
    """The median of `values` with their range, e.g. `57324 (50091-60893)`."""
    values = list(values)
    return (f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})")


LABEL = {"gateway": "gateway", "nginx": "nginx", "floor": "floor", "haproxy": "HAProxy", "lua": "Lua"}


def report(args, scenarios, runs, storm, mem, haproxy_skipped=None, lua_skipped=None):
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
        row = {"name": name, "desc": desc}
        for who, rs in runs[name].items():
            row[who] = {k: med(rs, k) for k in ("rps", "p50_us", "p99_us", "cpu_us_per_req")}
            row[who]["errors"] = sum(r["socket_errors"] for r in rs)
            row[who]["runs"] = rs
            if rs and "upstream_conns" in rs[0]:
                # The run that opened the most (the first, with an empty pool, as a rule).
                worst = max(rs, key=lambda r: r["upstream_conns"])
                row[who]["conns"], row[who]["requests"] = worst["upstream_conns"], worst["requests"]
        rows.append(row)

    def ratio(r, a, b):
        return f"**{r[a]['rps'] / r[b]['rps']:.2f}x**" if a in r and b in r else "n/a"

    def paired(r, a, b):
        """The ratio of medians, and the median over rounds of a/b in the same round."""
        if a not in r or b not in r:
            return "n/a"
        by_round = statistics.median(x["rps"] / y["rps"] for x, y in zip(r[a]["runs"], r[b]["runs"]))
        return f"{ratio(r, a, b)} (paired {by_round:.2f}x)"

    def paired_range(r, a, b):
        """The ratio of medians, and the median and range over rounds of a/b in the same round."""
        if a not in r or b not in r:
            return "n/a"
        by_round = [x["rps"] / y["rps"] for x, y in zip(r[a]["runs"], r[b]["runs"])]
        return f"{ratio(r, a, b)} (paired {spread(by_round, '.2f')})"

    def each(r, key, fmt):
        return " / ".join(format(r[w][key], fmt) if w in r else "-" for w in SERVERS)

    haproxy_version = version(["haproxy", "-v"]) if shutil.which("haproxy") else "HAProxy not installed"
    lua_version = "Lua module " + (lua_module_version() or "not installed")
    lines = [
        RESULTS_TITLE,
        "",
        RESULTS_INTRO,
        "",
        "## The gateway, nginx, the floor, HAProxy and nginx + Lua (full run)",
        "",
        f"Made by `benches/load/run {' '.join(sys.argv[1:])}` on {stamp()}.",
        "",
        f"- machine: {os.cpu_count()} cores, {cpu}, Linux {platform.release()}",
        f"- versions: {version([str(BIN), '--version'])}; {version(['nginx', '-v'])}; {haproxy_version}; {lua_version}; "
        f"{version(['wrk', '-v'])}; {version(['rustc', '--version'])}",
        f"- load: wrk -t1 -c{args.connections} -d{args.duration}s on the same box; server workers/threads: {args.workers}"
        f" (Pingora work_stealing: {args.work_stealing}); quota store: {args.quota}"
        + (f" (leases of {args.batch_max}, given back every 100 ms)" if args.quota == "redis-batched" else "")
        + f"; {args.rounds} rounds, every "
        f"server once per round in an order rotated each round, medians shown (req/s with their range "
        f"over the rounds)",
        f"- gateway /v1/check: `gateway.upstream.mode: {getattr(args, 'upstream_mode', None) or 'relay'}`" + ('' if getattr(args, 'upstream_mode', None) else ' (the default)'),
        f"- pinning: {pin_note()}",
        f"- table: {args.entries} generated disposable domains (`d<i>.com`); nginx's `map` and HAProxy's map hold the "
        f"same {args.entries} bodies; the Lua peer reads the gateway's own list files",
        "- floor: the bare Pingora floor (`examples/floor.rs`, the same Pingora, server options, allocator and "
        "per-connection request limit as the gateway): a `ProxyHttp` answering the same bytes from `request_filter` "
        "with no logic, and a bare `ProxyHttp` proxy (keep-alive pool) to the same upstream",
        "- HAProxy: doing the job: key hashes in a map (401 otherwise), per-key count in a stick table (429 past "
        "the limit), the domain bodies in a map answered with `http-request return`, the proxy to the same upstream"
        + (f" (**not measured**: {haproxy_skipped})" if haproxy_skipped else ""),
        "- Lua: nginx + Lua doing the job as a Kong plugin would (`benches/load/lua/`): the key's SHA-256 looked "
        "up in a Lua table (401), its origins (403), a per-project monthly counter in a `lua_shared_dict` (429 and "
        "the RateLimit headers), the domain lists read at start into Lua tables and each answer built as the "
        "gateway's JSON (422 for an invalid name), top-domains from the gateway's body, `/v1/check` by "
        "`proxy_pass` (keep-alive pool) after the same admission; it leaves out what the gateway does besides: "
        "no count kept across restarts, no MX, RDAP or neighbourhood inference, no public suffix list or UTS-46 "
        "mapping, no call log, metrics or hot reload of keys and table, top-domains a fixed body "
        "(see docs/scaling.md)"
        + (f" (**not measured**: {lua_skipped})" if lua_skipped else ""),
        "- cpu: server CPU time (user+sys from /proc) per request, microseconds; the /v1/check upstream is a "
        "separate nginx process whose CPU no server is charged",
        "",
        "| scenario | gateway req/s | nginx req/s | floor req/s | HAProxy req/s | Lua req/s | gateway/nginx | "
        "floor/nginx | gateway/floor | gateway/HAProxy | gateway/Lua | p50 us (gw / nginx / floor / HAProxy / Lua) | "
        "p99 us (same order) | cpu us/req (same order) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rps = " | ".join(spread(x["rps"] for x in r[w]["runs"]) if w in r else "-" for w in SERVERS)
        lines.append(f"| {r['name']} | {rps} | {ratio(r, 'gateway', 'nginx')} | {ratio(r, 'floor', 'nginx')} | "
                     f"{paired_range(r, 'gateway', 'floor')} | {ratio(r, 'gateway', 'haproxy')} | "
                     f"{paired(r, 'gateway', 'lua')} | "
                     f"{each(r, 'p50_us', '.0f')} | {each(r, 'p99_us', '.0f')} | {each(r, 'cpu_us_per_req', '.2f')} |")
    lines += ["", "Scenarios:", ""] + [f"- `{r['name']}`: {r['desc']}" for r in rows]
    check = next((r for r in rows if r["name"] == "check_proxied"), None)
    if check:
        lines += ["", "## Upstream connections (`check_proxied`)", "",
                  "Connections the upstream accepted during a server's run (nginx `stub_status`; the run "
                  f"with the most, over the rounds), with {args.connections} client connections. A pool "
                  "that reuses its connections opens at most one per concurrent request, once.", "",
                  "| server | upstream connections opened | requests in that run | requests per connection | reused |",
                  "|---|---:|---:|---:|---|"]
        for who in SERVERS:
            if who in check:
                c, n = check[who]["conns"], check[who]["requests"]
                # A pool at most as large as the client concurrency, kept for the whole run.
                reused = "yes" if c <= 2 * args.connections else "**no**"
                lines.append(f"| {LABEL[who]} | {c:.0f} | {n:.0f} | {n / max(c, 1):.0f} | {reused} |")
    if storm:
        st, so = storm["steady"], storm["storm"]
        errors = sum(r["socket_errors"] + r["non2xx"] for r in so)
        lines += ["", "## Reload storm", "",
                  f"The lookup scenario on the gateway while `disposable.txt` ({args.entries} entries) is replaced every {args.storm_interval_ms} ms "
                  f"({storm['writes']} writes, {storm['published']} new tables published; failed reloads logged: "
                  f"{storm['log_errors']}; `reload.build_priority: {args.build_priority}`).", "",
                  "| | req/s | p50 us | p99 us | p99.99 us | failed requests |", "|---|---:|---:|---:|---:|---:|",
                  f"| steady | {med(st, 'rps'):.0f} | {med(st, 'p50_us'):.0f} | {med(st, 'p99_us'):.0f} | {med(st, 'p9999_us'):.0f} | {sum(r['socket_errors'] + r['non2xx'] for r in st)} |",
                  f"| storm | {med(so, 'rps'):.0f} | {med(so, 'p50_us'):.0f} | {med(so, 'p99_us'):.0f} | {med(so, 'p9999_us'):.0f} | {errors} |",
                  "", f"p99 storm / steady: **{med(so, 'p99_us') / max(med(st, 'p99_us'), 1):.2f}x**"]
    lines += ["", "## Memory", "",
              "- RSS with the shipped defaults (built-in list + data/, ~56.5k names): " +
              (f"{mem['rss_default_kib'] / 1024:.1f} MiB" if mem["rss_default_kib"] is not None
               else "not measured (the shipped config did not start: its fixed ports were taken)"),
              f"- RSS with {args.entries} generated entries (after the load): {mem['rss_entries_kib'] / 1024:.1f} MiB",
              f"- start-up to listening with {args.entries} entries: {mem['start_seconds']:.2f} s",
              "", "![throughput and p99 per scenario](results.svg)", ""]
    # Keep the sections other runs wrote (the feature costs, the hand-written ones after Memory).
    old = Path(args.results).read_text() if Path(args.results).exists() else ""
    kept = re.findall(r"\n## (?!Reload storm\n|Memory\n|Upstream connections|The gateway, nginx, the floor)"
                      r"[^\n]*\n.*?(?=\n## |\Z)", old, flags=re.S)
    for section in kept:
        lines.append(section.strip("\n") + "\n")
    Path(args.results).write_text("\n".join(lines))
    svg(rows, Path(args.results).with_name("results.svg"))
    print("\n".join(lines))


def svg(rows, path):
    """A grouped bar chart: req/s and p99 per scenario, one bar per server."""
    w, h, pad = 1000, 420, 60
    panel_w = (w - 3 * pad) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>']
    colors = {"gateway": "#d35400", "nginx": "#2e86c1", "floor": "#7f8c8d", "haproxy": "#27ae60", "lua": "#8e44ad"}
    whos = [who for who in SERVERS if any(who in r for r in rows)]
    for pi, (title, key) in enumerate([("requests/s (higher is better)", "rps"),
                                       ("p99 latency, us (lower is better)", "p99_us")]):
        x0 = pad + pi * (panel_w + pad)
        top, bottom = 40, h - 90
        vmax = max(r[who][key] for r in rows for who in whos if who in r) * 1.1 or 1
        out.append(f'<text x="{x0}" y="24" font-size="14" font-weight="bold">{title}</text>')
        out.append(f'<line x1="{x0}" y1="{bottom}" x2="{x0 + panel_w}" y2="{bottom}" stroke="#333"/>')
        gw = panel_w / len(rows)
        bw = (gw - 12) / len(whos)
        for i, r in enumerate(rows):
            for j, who in enumerate(whos):
                if who not in r:
                    continue
                bh = (bottom - top) * r[who][key] / vmax
                bx = x0 + i * gw + 6 + j * bw
                out.append(f'<rect x="{bx:.1f}" y="{bottom - bh:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}" fill="{colors[who]}"/>')
                out.append(f'<text x="{bx + bw / 2:.1f}" y="{bottom - bh - 3:.1f}" text-anchor="middle" font-size="7">{r[who][key] / 1000:.0f}k</text>'
                           if key == "rps" else
                           f'<text x="{bx + bw / 2:.1f}" y="{bottom - bh - 3:.1f}" text-anchor="middle" font-size="7">{r[who][key]:.0f}</text>')
            out.append(f'<text x="{x0 + i * gw + gw / 2:.1f}" y="{bottom + 14}" text-anchor="end" transform="rotate(-30 {x0 + i * gw + gw / 2:.1f} {bottom + 14})">{r["name"]}</text>')
    names = {"gateway": "domain-risk-gateway", "nginx": "nginx", "floor": "bare Pingora floor", "haproxy": "HAProxy",
             "lua": "nginx + Lua"}
    for k, who in enumerate(whos):
        x = pad + k * 180
        out.append(f'<rect x="{x}" y="{h - 22}" width="12" height="12" fill="{colors[who]}"/><text x="{x + 16}" y="{h - 12}">{names[who]}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


if __name__ == "__main__":
    main()
