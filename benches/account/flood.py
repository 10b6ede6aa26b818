#!/usr/bin/env python3
"""One server key driving POST + DELETE /v1/keys pairs as fast as it can, against a gateway it
starts on loopback: pairs answered, refusals, the gateway's CPU and bytes written.

    benches/account/flood.py BINARY [--seconds 10] [--rate PER_SECOND:BURST]

`--rate 0:1` turns the account-route limit off (the "before" of issue 19 item 4).
"""
import argparse
import hashlib
import http.client
import json
import os
import socket
import subprocess
import tempfile
import time

SECRET = "drg_flood_server_key_0123456789abcdefghijklmnopqrstu"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    written = 0
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                written = int(line.split()[1])
    return cpu, written


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rate", default="5:30")
    a = ap.parse_args()
    per_second, burst = a.rate.split(":")
    d = tempfile.mkdtemp()
    port = free_port()
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    with open(f"{d}/keys.yaml", "w") as f:
        f.write(f"keys:\n  - id: flood\n    sha256: {digest}\n    plan: business\n")
    os.mkdir(f"{d}/data")
    with open(f"{d}/gateway.yaml", "w") as f:
        f.write(
            f"version: 1\nthreads: 2\npid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\n"
            "grace_period_seconds: 1\ngraceful_shutdown_timeout_seconds: 1\n"
            f"gateway:\n  listen: 127.0.0.1:{port}\n  admin:\n    listen: unix:{d}/admin.sock\n"
            "  data:\n    dir: data\n    builtin_disposable: false\n  mx:\n    enabled: false\n  rdap:\n    enabled: false\n"
            "  quota:\n    state_file: state/quota.counters\n"
            f"  access:\n    keys_file: keys.yaml\n    account_rate: {{ per_second: {per_second}, burst: {burst} }}\n"
        )
    gw = subprocess.Popen([a.binary, "-c", f"{d}/gateway.yaml", "serve"],
                          stdout=subprocess.DEVNULL, stderr=open(f"{d}/gateway.log", "w"))
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        auth = {"Authorization": f"Bearer {SECRET}"}
        cpu0, w0 = proc_stats(gw.pid)
        pairs = refused = 0
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            conn.request("POST", "/v1/keys", body=b"{}",
                         headers={**auth, "Content-Type": "application/json"})
            r = conn.getresponse()
            body = r.read()
            if r.status != 201:   # 429 (rate), or 409 once a refused DELETE left max_keys keys
                refused += 1
                continue
            key_id = json.loads(body)["id"]
            conn.request("DELETE", f"/v1/keys/{key_id}", headers=auth)
            r = conn.getresponse()
            r.read()
            if r.status == 204:
                pairs += 1
            else:
                refused += 1
        cpu1, w1 = proc_stats(gw.pid)
        print(json.dumps({
            "rate": a.rate, "seconds": a.seconds, "pairs": pairs,
            "pairs_per_second": round(pairs / a.seconds, 1), "refused_429": refused,
            "gateway_cpu_seconds": round(cpu1 - cpu0, 2),
            "cores": round((cpu1 - cpu0) / a.seconds, 3),
            "mb_written": round((w1 - w0) / 1e6, 1),
        }))
    finally:
        gw.terminate()
        gw.wait()


if __name__ == "__main__":
    main()
