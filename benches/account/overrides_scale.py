#!/usr/bin/env python3
"""What one override write costs against how many overrides the store holds (issue 93, item 7):
two gateways on one throwaway PostgreSQL cluster (Debian's postgresql, durable settings), for
each store size N (1,000 and 100,000 rows by default) a fresh database seeded with N overrides
spread over 1,000 projects, then WRITES `PUT /v1/overrides/{new name}` round-robin over 10 of
those projects on gateway A, one after another on one keep-alive connection.

Prints a markdown section: PUT latency (p50, p90, p99), the CPU a write costs the writer (A)
and the follower (B) net of their idle CPU, PostgreSQL's too, and how long after the last
`PUT` was answered B serves it.

    benches/account/overrides_scale.py BINARY [--rows 1000,100000] [--writes 300] [--out FILE]
"""
import argparse
import contextlib
import csv
import hashlib
import http.client
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The throwaway cluster, the port picker and the quantiles are overrides.py's: one way to run
# PostgreSQL for the account benches.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overrides import Postgres, free_port, quantiles  # noqa: E402

KIND = "overrides"  # drg_records.kind and the NOTIFY payload of an override write
PROJECTS = 1_000
WRITERS = 10  # projects with a key; the writes go to these, and they hold seeded rows too
IDLE_SECONDS = 5.0
POLL_CALIBRATION = 200  # list calls on B to learn what one poll of B costs it
HTTP_TIMEOUT = 30.0
READY_TIMEOUT = 120.0
SEEN_TIMEOUT = 120.0
SETTLE_TIMEOUT = 60.0
TICK = os.sysconf("SC_CLK_TCK")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def project(i):
    return f"p{i:04d}"


# Every 100th project gets a key: the writers are among the 1,000 and hold N/1,000 rows each.
WRITER_PROJECTS = [project(i * (PROJECTS // WRITERS)) for i in range(WRITERS)]


def layout(n, hold=None):
    """The (project, domain) of each of the N seeded rows: row j in project j mod 1,000, or,
    with `hold`, HOLD rows in each writer project and the rest over the other 990 (so a
    writer's project is the same size whatever N: what changes is the store alone)."""
    if hold is None:
        return [(project(j % PROJECTS), f"s{j // PROJECTS}-{project(j % PROJECTS)}.example")
                for j in range(n)]
    rows = [(p, f"s{k}-{p}.example") for p in WRITER_PROJECTS for k in range(hold)][:n]
    others = [project(i) for i in range(PROJECTS) if project(i) not in WRITER_PROJECTS]
    for j in range(n - len(rows)):
        p = others[j % len(others)]
        rows.append((p, f"s{j // len(others)}-{p}.example"))
    return rows


def key_id(p):
    return f"k-{p}"


def secret(p):
    return f"drg_scale_bench_{p}_0123456789abcdefghijklmnopqrstuv"


def cpu_seconds(pid):
    """utime + stime of process `pid`, every thread (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces: the fields are counted after its closing ')'.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def postgres_cpu(pg):
    """The cluster's CPU: the postmaster and its children (backends, walwriter, checkpointer).
    A backend that ends within a window takes its CPU with it; the gateways' pools keep theirs."""
    with open(f"{pg.dir}/data/postmaster.pid") as f:
        master = int(f.readline())
    total = cpu_seconds(master)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def psql(pg, url, sql, timeout=600):
    """Runs `sql` (a script: it may carry COPY data) on `url`, stopping at the first error."""
    out = subprocess.run([f"{pg.bin}/psql", "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1",
                          "-d", url, "-f", "-"],
                         input=sql, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"psql: {out.stderr.strip()}")
    return out.stdout.strip()


def seed(pg, url, n, hold=None):
    """N overrides over the 1,000 projects (row j in project j mod 1,000), written with SQL as
    the API writes them: one `drg_records` row each, `body` the record's JSON as serde_json
    writes it (compact, fields in the struct's order, `removed` left out when false), stamp
    in microseconds, set_at in seconds. Then the kind's revision moves under a new token, kept
    in `drg_revision_log`, and `NOTIFY drg_revision, 'overrides'` tells every gateway, in the
    same transaction: what a write does (records/sql.rs, control/revision.rs). Through the API
    this would be N round trips with an fsync each, and a whole-kind reload on every gateway
    after each. The audit trail a write also appends is not seeded: no gateway loads it."""
    now = int(time.time())
    stamp0 = now * 1_000_000
    data = io.StringIO()
    w = csv.writer(data, lineterminator="\n")
    for j, (p, domain) in enumerate(layout(n, hold)):
        body = json.dumps({"project": p, "domain": domain,
                           "verdict": "block" if j % 2 else "allow", "note": "",
                           "set_by": key_id(p), "set_at": now, "stamp": stamp0 + j},
                          separators=(",", ":"))
        w.writerow([KIND, p, domain, stamp0 + j, "false", body])
    load(pg, url, KIND, "drg_records (kind, project, key, stamp, removed, body)", data, n)


def load(pg, url, kind, into, data, n):
    """COPYs the CSV `data` into `into` (a table and its columns) and moves `kind`'s revision
    under a new token, kept in `drg_revision_log` and naming no project (the kind is read
    whole), with `NOTIFY drg_revision, kind`, in one transaction: a write's steps
    (control/revision.rs). Then checks the table holds `n` rows of `kind`."""
    table = into.split()[0]
    token = os.urandom(8).hex()
    sql = (
        "BEGIN;\n"
        f"COPY {into} FROM STDIN WITH (FORMAT csv);\n" + data.getvalue() + "\\.\n"
        # move_revision's two statements (its trim of the log past 512 has nothing to trim).
        f"WITH r AS (INSERT INTO drg_revision (kind, n, token) VALUES ('{kind}', 1, "
        f"'{token}') ON CONFLICT (kind) DO UPDATE SET n = drg_revision.n + 1, "
        "token = excluded.token RETURNING n, token)\n"
        f"INSERT INTO drg_revision_log (kind, n, token) SELECT '{kind}', n, token FROM r\n"
        "ON CONFLICT (kind, n) DO UPDATE SET token = excluded.token;\n"
        f"SELECT pg_notify('drg_revision', '{kind}');\n"
        "COMMIT;\n"
    )
    psql(pg, url, sql)
    # Statistics and a checkpoint now, so neither autovacuum nor the checkpointer is set off
    # by the bulk insert in the middle of the measurement.
    psql(pg, url, f"VACUUM ANALYZE {table}; CHECKPOINT;")
    which = " WHERE kind = 'overrides'" if table == "drg_records" else ""
    held = psql(pg, url, f"SELECT count(*) FROM {table}{which};")
    if int(held.splitlines()[-1]) != n:
        raise RuntimeError(f"seeded {held} rows of {kind}, not {n}")


class Gateway:
    """One gateway on loopback with its own state folder and ports, configured as overrides.py
    configures its one (no lists, no MX, no RDAP: nothing reached beyond loopback), on the
    control store at `url`, with a key for each writer project."""

    def __init__(self, binary, url, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix=f"drg-scale-{name}-")
        self.port = free_port()
        d = self.dir
        with open(f"{d}/keys.yaml", "w") as f:
            f.write("keys:\n")
            for p in WRITER_PROJECTS:
                digest = hashlib.sha256(secret(p).encode()).hexdigest()
                f.write(f"  - id: {key_id(p)}\n    sha256: {digest}\n    plan: business\n"
                        f"    project: {p}\n")
        os.mkdir(f"{d}/data")
        with open(f"{d}/gateway.yaml", "w") as f:
            f.write(
                f"version: 1\nthreads: 2\npid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\n"
                "grace_period_seconds: 1\ngraceful_shutdown_timeout_seconds: 1\n"
                f"gateway:\n  listen: 127.0.0.1:{self.port}\n"
                f"  admin:\n    listen: unix:{d}/admin.sock\n"
                "  data:\n    dir: data\n    builtin_disposable: false\n  mx:\n    enabled: false\n"
                "  rdap:\n    enabled: false\n  quota:\n    state_file: state/quota.counters\n"
                "  access:\n    keys_file: keys.yaml\n"
                "    account_rate: { per_second: 0, burst: 1 }\n"
                f"  control: {{ url: '{url}' }}\n"
            )
        self.log = open(f"{d}/gateway.log", "w")
        self.proc = subprocess.Popen([binary, "-c", f"{d}/gateway.yaml", "serve"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self.conn = None

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def alive(self):
        if self.proc.poll() is not None:
            with open(f"{self.dir}/gateway.log") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"gateway {self.name} exited ({self.proc.returncode}):\n{tail}")

    def call(self, method, path, p=None, body=None):
        """(status, body) over this gateway's keep-alive connection (opened again if lost),
        as project `p`'s key."""
        headers = {"Authorization": f"Bearer {secret(p)}"} if p else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                       timeout=HTTP_TIMEOUT)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                r = self.conn.getresponse()
                return r.status, r.read()
            except (ConnectionError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def wait_ready(self, deadline):
        """Until `/readyz` answers 200: the overrides' first read is done by then (the gateway
        says `control_store_loading` until it is)."""
        while True:
            self.alive()
            try:
                if self.call("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                self.conn = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"gateway {self.name} not ready")
            time.sleep(0.05)

    def listed(self, p):
        """The domains `GET /v1/overrides` gives project `p` (every page)."""
        names, cursor = [], ""
        while True:
            q = "/v1/overrides?limit=1000" + (f"&cursor={cursor}" if cursor else "")
            status, body = self.call("GET", q, p)
            if status != 200:
                raise RuntimeError(f"{self.name} GET {q}: {status} {body[:200]!r}")
            page = json.loads(body)
            names += [i["domain"] for i in page["items"]]
            if not page.get("next_cursor"):
                return names
            cursor = page["next_cursor"]

    def serves(self, p, name):
        """Whether the list of `p` holds `name`: one page of one item, from just before it
        (the cursor is exclusive, and no other name of the run starts with `name[:-1]`)."""
        status, body = self.call("GET", f"/v1/overrides?limit=1&cursor={name[:-1]}", p)
        items = json.loads(body)["items"] if status == 200 else []
        return bool(items) and items[0]["domain"] == name

    def stop(self):
        if self.conn is not None:
            self.conn.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def cpu_of(meters):
    return {k: f() for k, f in meters.items()}


def settle(meters, idle, deadline):
    """Until every process's CPU over a quarter second is back near its idle pace (a reload
    still running after the last answer belongs to the writes)."""
    while time.monotonic() < deadline:
        before, t = cpu_of(meters), time.monotonic()
        time.sleep(0.25)
        after, dt = cpu_of(meters), time.monotonic() - t
        # Two clock ticks of slack: /proc counts in ticks.
        if all(after[k] - before[k] <= idle[k] * dt + 2 / TICK for k in meters):
            return
    raise TimeoutError("the processes did not come back to idle")


@contextlib.contextmanager
def pair(binary, pg, db, seed_db, listed):
    """Two gateways A and B on a fresh database `db`, seeded by `seed_db(url)` once A made the
    schema (with the NOTIFY a write sends, so A reads the rows as a follower would), each
    listing what `listed(gw, p)` must for every writer project before they are given; both
    stopped after. Yields (a, b, meters, idle): each process's CPU meter and idle pace."""
    psql(pg, pg.url, f"DROP DATABASE IF EXISTS {db}; CREATE DATABASE {db};")
    url = pg.url.rsplit("/", 1)[0] + f"/{db}"
    gws = []
    try:
        a = Gateway(binary, url, "a")
        gws.append(a)
        a.wait_ready(time.monotonic() + READY_TIMEOUT)
        t = time.monotonic()
        seed_db(url)
        print(f"[{db}] seeded in {time.monotonic() - t:.1f} s", file=sys.stderr)
        b = Gateway(binary, url, "b")
        gws.append(b)
        b.wait_ready(time.monotonic() + READY_TIMEOUT)
        deadline = time.monotonic() + READY_TIMEOUT
        for gw in (a, b):
            for p in WRITER_PROJECTS:
                while not listed(gw, p):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{gw.name} does not list {p}'s seeded rows")
                    time.sleep(0.1)
        meters = {"a": a.cpu, "b": b.cpu, "pg": lambda: postgres_cpu(pg)}
        # Idle pace, each process alone: the revision poll, timers. Taken as a rate and
        # charged over the writes' window, which is not known before they run.
        c0, t0 = cpu_of(meters), time.monotonic()
        time.sleep(IDLE_SECONDS)
        c1, t1 = cpu_of(meters), time.monotonic()
        yield a, b, meters, {k: (c1[k] - c0[k]) / (t1 - t0) for k in meters}
        a.alive()
        b.alive()
    finally:
        for gw in gws:
            gw.stop()


def one_size(binary, pg, n, writes, hold=None):
    """Seeds a fresh database with `n` overrides, runs the writes on two gateways, returns
    the row of the table."""
    seeded = layout(n, hold)
    per = {p: sum(1 for q, _ in seeded if q == p) for p in WRITER_PROJECTS}
    probe = next(d for q, d in seeded if q == WRITER_PROJECTS[0])
    with pair(binary, pg, f"drg_scale_{n}", lambda url: seed(pg, url, n, hold),
              lambda gw, p: len(gw.listed(p)) == per[p]) as (a, b, meters, idle):
        # What one list poll costs B (its key check, its scan of the held set), so the polls
        # that find when B serves the last write are not counted as follower work.
        c0, t0 = cpu_of(meters), time.monotonic()
        for _ in range(POLL_CALIBRATION):
            b.serves(WRITER_PROJECTS[0], probe)
        c1, t1 = cpu_of(meters), time.monotonic()
        poll_cost = max(0.0, (c1["b"] - c0["b"] - idle["b"] * (t1 - t0)) / POLL_CALIBRATION)

        body = b'{"verdict":"block"}'
        latencies, names = [], []
        c0, t0 = cpu_of(meters), time.monotonic()
        for i in range(writes):
            p = WRITER_PROJECTS[i % WRITERS]
            name = f"w{i:04d}-{p}.example"
            s = time.perf_counter()
            status, answer = a.call("PUT", f"/v1/overrides/{name}", p, body)
            latencies.append(time.perf_counter() - s)
            if status != 201:
                raise RuntimeError(f"PUT {name}: {status} {answer[:200]!r}")
            names.append((p, name))
        answered = time.monotonic()
        polls = 0
        while True:
            polls += 1
            if b.serves(*names[-1]):
                seen = time.monotonic()
                break
            if time.monotonic() - answered > SEEN_TIMEOUT:
                raise TimeoutError("B never served the last write")
            time.sleep(0.002)
        settle(meters, idle, time.monotonic() + SETTLE_TIMEOUT)
        c1, t1 = cpu_of(meters), time.monotonic()
        window = t1 - t0

        def per_write(k, minus=0.0):
            return (c1[k] - c0[k] - idle[k] * window - minus) / writes * 1000

        row = {
            "rows": n, "put": quantiles(latencies),
            "writer": per_write("a"), "follower": per_write("b", polls * poll_cost),
            "postgres": per_write("pg"), "seen_ms": (seen - answered) * 1000,
            "writes_s": answered - t0, "window_s": window, "polls": polls,
            "poll_ms": poll_cost * 1000, "idle": idle,
        }
    print(f"[{n}] {json.dumps(row)}", file=sys.stderr)
    return row


def made(command, binary, pg_version):
    """Where a section's numbers come from: the command, when, the commit and binary, the
    machine and PostgreSQL."""
    built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(binary)))
    date = subprocess.run(["date", "-u"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return (f"Made by `{command}` on {date}, commit {commit} (the binary built {built}); "
            "machine: 2 cores, shared by both gateways (release binary, `threads: 2`), "
            f"PostgreSQL {pg_version} (a throwaway cluster, fsync and synchronous_commit on) "
            "and the client, all on loopback.")


def section(rows, command, writes, pg_version, binary, hold=None):
    out = [
        "## A write's cost against what is stored (issue 93, item 7)",
        "",
        made(command, binary, pg_version) + " For each size a fresh database is seeded with SQL "
        "with that many overrides over 1,000 projects ("
        + ("spread evenly" if hold is None else
           f"{hold} in each of the 10 projects written to, the rest over the other 990")
        + "; rows and bodies as the API writes "
        "them, the revision moved and `NOTIFY` sent as a write does), and both gateways are "
        "checked to list the seeded rows of the 10 projects written to. Then "
        f"{writes} `PUT /v1/overrides/{{new name}}` round-robin over those 10 projects on "
        "gateway A, one after another on one keep-alive connection; gateway B follows "
        "through the store. CPU: utime + stime from /proc over the writes until B serves "
        "the last one and every process is idle again, minus each process's idle pace "
        f"(measured over {IDLE_SECONDS:.0f} s just before) over that window, B's also minus "
        "the list polls that found when it serves the last write; a write's share.",
        "",
        "| rows | PUT p50 · p90 · p99 ms | writer CPU ms/write | follower CPU ms/write "
        "| B sees the last write after (ms) | PostgreSQL CPU ms/write |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        q = r["put"]
        out.append(f"| {r['rows']:,} | {q['p50']} · {q['p90']} · {q['p99']} "
                   f"| {r['writer']:.1f} | {r['follower']:.1f} | {r['seen_ms']:.0f} "
                   f"| {r['postgres']:.1f} |")
    out.append("")
    out.append("The writes took " + ", ".join(
        f"{r['writes_s']:.1f} s at {r['rows']:,} rows" for r in rows) + ".")
    return "\n".join(out) + "\n"


def parser(doc, sizes):
    """The arguments both scale benches take: the binary, the store `sizes`, the writes, --out."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument(sizes, default="1000,100000",
                    help="store sizes, comma-separated (default: 1000,100000)")
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--out", help="also write the markdown section to this file")
    return ap


def main():
    ap = parser(__doc__, "--rows")
    ap.add_argument("--writers-hold", type=int, default=None,
                    help="rows each of the 10 projects written to holds, whatever the size "
                         "(default: the size spread evenly over the 1,000 projects)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.rows.split(",")]
    binary = os.path.abspath(a.binary)
    command = shlex.join(["benches/account/overrides_scale.py"] + sys.argv[1:])
    rows, pg_version = on_cluster(
        lambda pg: [one_size(binary, pg, n, a.writes, a.writers_hold) for n in sizes])
    emit(section(rows, command, a.writes, pg_version, binary, a.writers_hold), a.out)


def on_cluster(run):
    """`run(pg)` on a throwaway cluster, removed after: what it gave, and PostgreSQL's
    version. SIGTERM ends the run through the finally block."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pg = None
    try:
        pg = Postgres()
        version = psql(pg, pg.url, "SHOW server_version;").split()[0]
        return run(pg), version
    finally:
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.dir, ignore_errors=True)


def emit(text, out):
    """Prints the section, and writes it to `out` too when given."""
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
