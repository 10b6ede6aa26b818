"""What one counted call costs Redis: commands (INFO commandstats deltas) and redis-server CPU time
(/proc) per call, for the exact and batched quota modes, on a single server, a 3-master cluster or
a Sentinel-watched master with one replica. From the CPU time per call: the calls per second one
Redis core sustains. Loopback only; each run lasts --duration seconds of wrk.

    python3 benches/load/redis_ops.py --mode single --duration 5
    python3 benches/load/redis_ops.py --mode cluster --batched

The Redis-side figures do not depend on the gateway's build (the debug binary is the default, so
no release build is needed); its request rate does, and a slower gateway makes Redis do a little
less work per wake-up, so the figures lean pessimistic.
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "drg_redisops_key_0123456789abcdefghijklmnopqrstuv"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30, proc=None, log=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"exited with {proc.returncode}:\n{Path(log).read_text() if log else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True,
                          check=True).stdout


def cpu_seconds(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commandstats(port):
    """calls per command (`cmdstat_evalsha:calls=12,...`)."""
    out = {}
    for line in cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            out[name] = int(rest.split("calls=")[1].split(",")[0])
    return out


class Deployment:
    def __init__(self, mode, tmp, wait_replicas):
        self.tmp, self.procs, self.data = tmp, [], []  # data: (role, port, pid)
        if mode == "single":
            self.data.append(("master", *self.server()))
            self.yaml = f"url: 'redis://127.0.0.1:{self.data[0][1]}/'"
        elif mode == "cluster":
            for _ in range(3):
                self.data.append(("master", *self.server("--cluster-enabled", "yes",
                                                          "--cluster-config-file", "nodes.conf")))
            subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{p}" for _, p, _ in self.data], "--cluster-yes"],
                           capture_output=True, check=True)
            for _, p, _ in self.data:
                while "cluster_state:ok" not in cli(p, "CLUSTER", "INFO"):
                    time.sleep(0.1)
            nodes = ", ".join(f"'redis://127.0.0.1:{p}/'" for _, p, _ in self.data)
            self.yaml = f"mode: cluster, nodes: [{nodes}]"
        else:
            master = self.server()
            replica = self.server("--replicaof", "127.0.0.1", str(master[0]))
            self.data += [("master", *master), ("replica", *replica)]
            while "master_link_status:up" not in cli(replica[0], "INFO", "replication"):
                time.sleep(0.1)
            conf = Path(tmp) / "sentinel.conf"
            conf.write_text("")
            sport = free_port()
            self.spawn([str(conf), "--port", str(sport), "--bind", "127.0.0.1", "--sentinel",
                        "monitor", "quota", "127.0.0.1", str(master[0]), "1"], sport)
            while "slave" not in cli(sport, "SENTINEL", "REPLICAS", "quota"):
                time.sleep(0.1)
            self.yaml = (f"mode: sentinel, sentinel: {{ master_name: quota, "
                         f"nodes: ['redis://127.0.0.1:{sport}/'], wait_replicas: {wait_replicas} }}")

    def spawn(self, args, port):
        p = subprocess.Popen(["redis-server", *args], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        wait_port(port)
        return p.pid

    def server(self, *extra):
        port = free_port()
        # A cluster node's bus listens 10000 above its port.
        while "--cluster-enabled" in extra and port > 55535:
            port = free_port()
        d = Path(self.tmp) / f"redis-{port}"
        d.mkdir()
        pid = self.spawn(["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(d),
                          *extra], port)
        return port, pid

    def sample(self):
        return [(role, port, cpu_seconds(pid), commandstats(port)) for role, port, pid in self.data]

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", choices=["single", "cluster", "sentinel"], default="single")
    ap.add_argument("--batched", action="store_true", help="sync_interval_ms 100, batch_max 100")
    ap.add_argument("--wait-replicas", type=int, default=1, help="sentinel mode's wait_replicas")
    ap.add_argument("--duration", type=int, default=5)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--binary", default=str(ROOT / "target" / "debug" / "domain-risk-gateway"))
    args = ap.parse_args()
    for tool in ("redis-server", "redis-cli", "wrk"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed")
    tmp = tempfile.mkdtemp(prefix="redis-ops-")
    dep = Deployment(args.mode, tmp, args.wait_replicas)
    gw = None
    try:
        (Path(tmp) / "data").mkdir()
        (Path(tmp) / "data" / "disposable.txt").write_text("d1.com\n")
        shutil.copy(ROOT / "data" / "free_providers.txt", Path(tmp) / "data")
        (Path(tmp) / "keys.yaml").write_text(
            f"keys:\n  - id: ops\n    sha256: {hashlib.sha256(KEY.encode()).hexdigest()}\n"
            "    plan: unlimited\n")
        batch = ", sync_interval_ms: 100, batch_max: 100" if args.batched else ""
        port = free_port()
        (Path(tmp) / "gateway.yaml").write_text(f"""version: 1
threads: 1
pid_file: {tmp}/gw.pid
upgrade_sock: {tmp}/gw.sock
grace_period_seconds: 0
graceful_shutdown_timeout_seconds: 1
gateway:
  listen: 127.0.0.1:{port}
  drain_seconds: 0
  upstream: {{ address: "127.0.0.1:{free_port()}" }}
  data: {{ dir: data, builtin_disposable: false }}
  access: {{ keys_file: keys.yaml, plans: {{ unlimited: 1000000000000 }} }}
  quota: {{ store: redis, redis: {{ {dep.yaml}, call_timeout_ms: 200{batch} }} }}
  mx: {{ enabled: false }}
  rdap: {{ enabled: false }}
  calls: {{ enabled: false }}   # call logs write to Redis too: measure the quota alone
""")
        log = open(Path(tmp) / "gateway.log", "w")
        gw = subprocess.Popen([args.binary, "-c", str(Path(tmp) / "gateway.yaml"), "serve"],
                              stdout=log, stderr=log)
        wait_port(port, proc=gw, log=Path(tmp) / "gateway.log")
        url = f"http://127.0.0.1:{port}/v1/public/domain/example.org"
        # Warm-up: connections made, script loaded, first lease taken.
        subprocess.run(["wrk", "-t1", "-c4", "-d1s", "-H", f"Authorization: Bearer {KEY}", url],
                       capture_output=True, check=True)
        time.sleep(0.3)
        before = dep.sample()
        out = subprocess.run(["wrk", "-t1", f"-c{args.connections}", f"-d{args.duration}s",
                              "-s", str(ROOT / "benches" / "load" / "report.lua"),
                              "-H", f"Authorization: Bearer {KEY}", url],
                             capture_output=True, text=True, check=True).stdout
        # Unused leases go back within the sync interval: count that work too.
        time.sleep(0.5)
        after = dep.sample()
        r = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
        calls = r["requests"] - r["non2xx"]
        if r["non2xx"] or r["socket_errors"]:
            print(f"warning: {r['non2xx']} non-2xx, {r['socket_errors']} socket errors", file=sys.stderr)
        result = {"mode": args.mode, "batched": args.batched, "calls": calls,
                  "wait_replicas": args.wait_replicas if args.mode == "sentinel" else 0,
                  "gateway_calls_per_s": round(calls / (r["duration_us"] / 1e6)), "servers": []}
        cpu_total = 0.0
        for (role, port, c0, s0), (_, _, c1, s1) in zip(before, after):
            cmds = {k: v - s0.get(k, 0) for k, v in s1.items() if v - s0.get(k, 0) > 0}
            cmds.pop("info", None)
            cpu_total += c1 - c0
            result["servers"].append({
                "role": role, "port": port, "cpu_us_per_call": round((c1 - c0) * 1e6 / calls, 2),
                "commands_per_call": {k: round(v / calls, 4) for k, v in sorted(cmds.items())}})
        # What the gateway sends (the rest of commandstats runs inside the script).
        sent = sum(v for s in result["servers"] if s["role"] == "master"
                   for k, v in s["commands_per_call"].items()
                   if k in ("evalsha", "eval", "wait", "script|load", "ping"))
        result["round_trip_commands_per_call"] = round(sent, 4)
        result["master_cpu_us_per_call"] = round(
            sum(s["cpu_us_per_call"] for s in result["servers"] if s["role"] == "master"), 2)
        result["calls_per_s_per_master_core"] = round(1e6 / max(result["master_cpu_us_per_call"], 1e-9))
        print(json.dumps(result, indent=1))
    finally:
        if gw:
            gw.kill()
            gw.wait()
        dep.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
