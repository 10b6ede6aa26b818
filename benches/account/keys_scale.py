#!/usr/bin/env python3
"""What one key change costs against how many API-made keys the store holds (issue 93, item 7,
for keys): two gateways on one throwaway PostgreSQL cluster (durable settings), for each store
size N (1,000 and 100,000 keys by default) a fresh database seeded with N API-made keys, 4 in
each of the 10 projects with an operator key and the rest at most 10 a project (the business
plan's `max_keys`) over as many other projects as that takes; then WRITES changes on gateway A
over those 10 projects, one after another on one keep-alive connection: `POST /v1/keys` in one
round of the 10, `DELETE` of the key each made in the next.

Prints a markdown section: change latency (p50, p90, p99), the CPU a change costs the writer
(A), the follower (B) and PostgreSQL net of their idle pace, and how long after the last change
was answered B holds it (the revoked key answers 401 there).

    benches/account/keys_scale.py BINARY [--keys 1000,100000] [--writes 300] [--gap-ms 0]
                                  [--out FILE]

`--gap-ms G` waits G ms after each change: changes further apart than the key cache's write
delay (200 ms) each cost a write of the cache, which back-to-back changes share.
"""
import csv
import hashlib
import http.client
import io
import json
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overrides import quantiles  # noqa: E402
from overrides_scale import (  # noqa: E402
    IDLE_SECONDS, SEEN_TIMEOUT, SETTLE_TIMEOUT, WRITER_PROJECTS, WRITERS,
    cpu_of, emit, load, made, on_cluster, pair, parser, settle,
)

KIND = "keys"  # drg_revision.kind and the NOTIFY payload of a key change
HOLD = 4  # seeded keys in each project written to (room for one more under max_keys 10)
PER_PROJECT = 10  # the business plan's max_keys: at most this many seeded keys a project


def layout(n):
    """The project of each of the N seeded keys: HOLD in each writer project, the rest at most
    PER_PROJECT a project over projects `q00000`, `q00001`, ... (none of them a writer)."""
    rows = [p for p in WRITER_PROJECTS for _ in range(HOLD)][:n]
    rest = n - len(rows)
    others = max(1, -(-rest // PER_PROJECT))
    rows += [f"q{j % others:05d}" for j in range(rest)]
    return rows


def seed(pg, url, n):
    """N API-made keys written with SQL as `POST /v1/keys` writes them: a `drg_keys` row each,
    `body` the key's JSON (`last_used` in its column), made by no key still held. Then the
    kind's revision moves under a new token, kept in the log, and `NOTIFY drg_revision, 'keys'`
    tells every gateway, in the same transaction (a key sync's write: the whole kind)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data = io.StringIO()
    w = csv.writer(data, lineterminator="\n")
    for j, p in enumerate(layout(n)):
        kid = f"key_{j:012x}"
        digest = hashlib.sha256(f"drg_seeded_{j}".encode()).hexdigest()
        body = json.dumps({"id": kid, "project": p, "plan": "business", "label": None,
                           "sha256": digest, "prefix": f"drg_s{j % 10_000_000:07d}"[:12],
                           "created_at": now, "last_used": None}, separators=(",", ":"))
        w.writerow([kid, p, 0, body])
    load(pg, url, KIND, "drg_keys (id, project, last_used, body)", data, n)


def listed(gw, p):
    status, body = gw.call("GET", "/v1/keys", p)
    if status != 200:
        raise RuntimeError(f"{gw.name} GET /v1/keys: {status} {body[:200]!r}")
    return [k for k in json.loads(body)["items"] if k["source"] == "api"]


def one_size(binary, pg, n, writes, gap=0.0):
    """Seeds a fresh database with `n` keys, runs the changes on two gateways, returns the row
    of the table."""
    per = min(n, HOLD * WRITERS) // WRITERS
    with pair(binary, pg, f"drg_keys_scale_{n}", lambda url: seed(pg, url, n),
              lambda gw, p: len(listed(gw, p)) == per) as (a, b, meters, idle):
        latencies, made = [], {}
        last = None
        c0, t0 = cpu_of(meters), time.monotonic()
        for i in range(writes):
            p = WRITER_PROJECTS[i % WRITERS]
            s = time.perf_counter()
            if (i // WRITERS) % 2 == 0:
                status, answer = a.call("POST", "/v1/keys", p, b'{"label":"bench"}')
                latencies.append(time.perf_counter() - s)
                if status != 201:
                    raise RuntimeError(f"POST /v1/keys for {p}: {status} {answer[:200]!r}")
                key = json.loads(answer)
                made[p] = key
                last = ("made", key["key"])
            else:
                key = made.pop(p)
                status, answer = a.call("DELETE", f"/v1/keys/{key['id']}", p)
                latencies.append(time.perf_counter() - s)
                if status != 204:
                    raise RuntimeError(f"DELETE {key['id']}: {status} {answer[:200]!r}")
                last = ("revoked", key["key"])
            if gap:
                time.sleep(gap)
        answered = time.monotonic()
        want = 200 if last[0] == "made" else 401
        while True:
            b.alive()
            status = b_status(b, last[1])
            if status == want:
                seen = time.monotonic()
                break
            if time.monotonic() - answered > SEEN_TIMEOUT:
                raise TimeoutError(f"B never held the last change ({last[0]})")
            time.sleep(0.002)
        settle(meters, idle, time.monotonic() + SETTLE_TIMEOUT)
        c1, t1 = cpu_of(meters), time.monotonic()
        window = t1 - t0

        def per_write(k):
            return (c1[k] - c0[k] - idle[k] * window) / writes * 1000

        row = {
            "keys": n, "change": quantiles(latencies), "writer": per_write("a"),
            "follower": per_write("b"), "postgres": per_write("pg"),
            "seen_ms": (seen - answered) * 1000, "writes_s": answered - t0,
            "window_s": window, "idle": idle,
        }
    print(f"[{n}] {json.dumps(row)}", file=sys.stderr)
    return row


def b_status(gw, secret):
    """The status `GET /v1/keys` answers on `gw` with the bearer `secret`."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    try:
        conn.request("GET", "/v1/keys", headers={"Authorization": f"Bearer {secret}"})
        r = conn.getresponse()
        r.read()
        return r.status
    finally:
        conn.close()


def section(rows, command, writes, pg_version, binary, gap_ms=0):
    out = [
        "## A key change's cost against the keys stored (issue 93, item 7)",
        "",
        made(command, binary, pg_version) + " For each size a fresh database is seeded with SQL "
        f"with that many API-made keys ({HOLD} in each of the 10 projects written to, the "
        f"rest at most {PER_PROJECT} a project over other projects). Then {writes} changes "
        "on gateway A over those 10 projects, one after another on one keep-alive "
        "connection" + (f", {gap_ms:g} ms apart" if gap_ms else "") + ": a `POST /v1/keys` "
        "in each in one round, the `DELETE` of that key in the "
        "next; gateway B follows through the store. CPU: utime + stime from /proc over the "
        "changes until B holds the last one and every process is idle again, minus each "
        f"process's idle pace (measured over {IDLE_SECONDS:.0f} s just before); a change's "
        "share.",
        "",
        "| keys | change p50 · p90 · p99 ms | writer CPU ms/change | follower CPU ms/change "
        "| B holds the last change after (ms) | PostgreSQL CPU ms/change |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        q = r["change"]
        out.append(f"| {r['keys']:,} | {q['p50']} · {q['p90']} · {q['p99']} "
                   f"| {r['writer']:.1f} | {r['follower']:.1f} | {r['seen_ms']:.0f} "
                   f"| {r['postgres']:.1f} |")
    return "\n".join(out) + "\n"


def main():
    ap = parser(__doc__, "--keys")
    ap.add_argument("--gap-ms", type=float, default=0.0)
    a = ap.parse_args()
    sizes = [int(s) for s in a.keys.split(",")]
    binary = os.path.abspath(a.binary)
    command = shlex.join(["benches/account/keys_scale.py"] + sys.argv[1:])
    gap = a.gap_ms / 1000
    rows, pg_version = on_cluster(
        lambda pg: [one_size(binary, pg, n, a.writes, gap) for n in sizes])
    emit(section(rows, command, a.writes, pg_version, binary, a.gap_ms), a.out)

if __name__ == "__main__":
    main()
