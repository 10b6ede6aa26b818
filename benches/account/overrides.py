#!/usr/bin/env python3
"""One project's override churn against a gateway it starts on loopback: CYCLES rounds of
PUT /v1/overrides/{new name} then DELETE it, one after the other, on the control store's
SQLite (the default) or on a throwaway PostgreSQL cluster (--postgres, Debian's postgresql).
Prints PUT and DELETE latency (p50, p90, p99) over the first and the last 500 cycles, and
the project's rows in the store after half the cycles and after all of them.

    benches/account/overrides.py BINARY [--cycles 3000] [--postgres]
"""
import argparse
import glob
import hashlib
import http.client
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time

SECRET = "drg_overrides_bench_key_0123456789abcdefghijklmnopq"
WINDOW = 500


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(args):
    """`args` run as the postgres user when this is root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--"] + args if os.geteuid() == 0 else args


class Postgres:
    def __init__(self):
        self.dir = tempfile.mkdtemp()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.bin = sorted(glob.glob("/usr/lib/postgresql/*/bin"))[-1]
        self.port = free_port()
        data = f"{self.dir}/data"
        subprocess.run(as_postgres([f"{self.bin}/initdb", "-D", data, "-U", "drg",
                                    "--auth=trust", "--no-sync"]),
                       check=True, stdout=subprocess.DEVNULL)
        # Durable as a production server is (fsync and synchronous commit on).
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        subprocess.run(as_postgres([f"{self.bin}/pg_ctl", "-D", data, "-l", f"{self.dir}/log",
                                    "-o", opts, "-w", "start"]),
                       check=True, stdout=subprocess.DEVNULL)
        self.url = f"postgres://drg@127.0.0.1:{self.port}/postgres"

    def rows(self):
        out = subprocess.run([f"{self.bin}/psql", "-X", "-t", "-A", "-d", self.url, "-c",
                              "SELECT count(*) FROM drg_records WHERE project = 'bench'"],
                             check=True, capture_output=True, text=True)
        return int(out.stdout.strip())

    def stop(self):
        subprocess.run(as_postgres([f"{self.bin}/pg_ctl", "-D", f"{self.dir}/data", "-m",
                                    "immediate", "stop"]), stdout=subprocess.DEVNULL)


def quantiles(xs):
    xs = sorted(xs)
    pick = lambda q: round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 2)
    return {"p50": round(statistics.median(xs) * 1000, 2), "p90": pick(0.9), "p99": pick(0.99)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--postgres", action="store_true")
    a = ap.parse_args()
    pg = Postgres() if a.postgres else None
    d = tempfile.mkdtemp()
    port = free_port()
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    with open(f"{d}/keys.yaml", "w") as f:
        f.write(f"keys:\n  - id: bench\n    sha256: {digest}\n    plan: business\n"
                "    project: bench\n")
    os.mkdir(f"{d}/data")
    control = f"  control: {{ url: '{pg.url}' }}\n" if pg else ""
    with open(f"{d}/gateway.yaml", "w") as f:
        f.write(
            f"version: 1\nthreads: 2\npid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\n"
            "grace_period_seconds: 1\ngraceful_shutdown_timeout_seconds: 1\n"
            f"gateway:\n  listen: 127.0.0.1:{port}\n  admin:\n    listen: unix:{d}/admin.sock\n"
            "  data:\n    dir: data\n    builtin_disposable: false\n  mx:\n    enabled: false\n"
            "  rdap:\n    enabled: false\n  quota:\n    state_file: state/quota.counters\n"
            "  access:\n    keys_file: keys.yaml\n    account_rate: { per_second: 0, burst: 1 }\n"
            + control
        )
    gw = subprocess.Popen([a.binary, "-c", f"{d}/gateway.yaml", "serve"],
                          stdout=subprocess.DEVNULL, stderr=open(f"{d}/gateway.log", "w"))

    def rows():
        if pg:
            return pg.rows()
        with sqlite3.connect(f"{d}/state/control.sqlite") as db:
            return db.execute("SELECT count(*) FROM drg_records WHERE project = 'bench'"
                              ).fetchone()[0]

    try:
        conn = None
        for _ in range(400):
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/readyz")
                if conn.getresponse().read() and True:
                    break
            except OSError:
                time.sleep(0.05)
        auth = {"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
        puts, deletes, half_rows = [], [], None
        for i in range(a.cycles):
            name = f"n{i}.example"
            t = time.perf_counter()
            conn.request("PUT", f"/v1/overrides/{name}", body=b'{"verdict":"block"}',
                         headers=auth)
            r = conn.getresponse()
            r.read()
            puts.append(time.perf_counter() - t)
            assert r.status == 201, r.status
            t = time.perf_counter()
            conn.request("DELETE", f"/v1/overrides/{name}", headers=auth)
            r = conn.getresponse()
            r.read()
            deletes.append(time.perf_counter() - t)
            assert r.status == 204, r.status
            if i + 1 == a.cycles // 2:
                half_rows = rows()
        print(json.dumps({
            "engine": "postgres" if pg else "sqlite", "cycles": a.cycles,
            "put_first": quantiles(puts[:WINDOW]), "put_last": quantiles(puts[-WINDOW:]),
            "delete_first": quantiles(deletes[:WINDOW]),
            "delete_last": quantiles(deletes[-WINDOW:]),
            "rows_at_half": half_rows, "rows_at_end": rows(),
        }))
    finally:
        gw.terminate()
        gw.wait()
        if pg:
            pg.stop()


if __name__ == "__main__":
    main()
