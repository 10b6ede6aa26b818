"""Big-table scenario (`--only bigtable`, issue 41): a table of --entries generated names.

Measures, on one gateway process:
- start-up to listening, the build time the gateway logs, RSS once started;
- three full rebuilds with no load (a line appended to the list each time): the build time the
  gateway logs, the wall time from the write to the swap, RSS after each, and the peak RSS
  (VmHWM) over start and reloads. The gateway runs unpinned here: the build may use both cores;
- a reload under load: the lookup scenario pinned as everywhere else (the gateway on core 0,
  wrk on core 1), rounds of a run with no reload and a run during which the table is rebuilt
  over and over (a new write as soon as the previous table is swapped in); req/s, p99 and failed
  requests of both, from the same process.

Prints a summary and a markdown table; `harness.py` calls `run`.
"""

import os
import re
import subprocess
import threading
import time
from pathlib import Path


def published(out):
    return (out / "gateway.log").read_text().count("domain table reloaded")


def build_times(out):
    """The build times (ms) the gateway logged, in order."""
    log = (out / "gateway.log").read_text()
    return [int(m) for m in re.findall(r"domain table built in (\d+) ms", log)]


def hwm_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


class Writer:
    """Rewrites the list with one more line each time (atomically, as operators should)."""

    def __init__(self, path):
        self.path = path
        self.text = path.read_text()
        self.n = 0

    def write(self):
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(self.text + f"big{self.n}.com\n")
        os.replace(tmp, self.path)
        self.n += 1


def wait_published(out, before, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if published(out) > before:
            return True
        time.sleep(0.02)
    return False


def show(what, r):
    load = os.getloadavg()[0]
    print(f"bigtable {what:22} {r['rps']:>8.0f} req/s p99 {r['p99_us']:>6} us p99.99 {r['p9999_us']:>6} us "
          f"failed {r['socket_errors'] + r['non2xx']} (load average {load:.2f})", flush=True)


def run(args, h):
    out = h.OUT
    s = h.Setup(args)
    s.write_gateway()
    server_pin = h.PIN["server"]
    h.PIN["server"] = []  # start and quiet reloads on every core
    result = {}
    try:
        took = s.start_gateway()
        h.PIN["server"] = server_pin
        pid = s.gw.pid
        time.sleep(2)
        result["start_s"] = took
        result["start_build_ms"] = build_times(out)[0]
        result["rss_start_kib"] = h.rss_kib(pid)
        writer = Writer(out / "data" / "disposable.txt")
        quiet = []
        for _ in range(3):
            before = published(out)
            t0 = time.time()
            writer.write()
            if not wait_published(out, before):
                raise RuntimeError("no table was published within 120 s of a write")
            wall = time.time() - t0
            time.sleep(2)
            quiet.append({"wall_s": wall, "build_ms": build_times(out)[-1], "rss_kib": h.rss_kib(pid)})
            print(f"bigtable reload: {wall:.2f} s from the write to the swap, built in "
                  f"{quiet[-1]['build_ms']} ms, RSS {quiet[-1]['rss_kib'] / 1024:.0f} MiB", flush=True)
        result["quiet"] = quiet
        result["peak_kib"] = hwm_kib(pid)
        if server_pin:
            subprocess.run(["taskset", "-a", "-p", "-c", server_pin[2], str(pid)],
                           check=True, capture_output=True)
        url = f"http://127.0.0.1:{s.gw_port}/v1/public/domain/{h.LISTED}"
        auth = (f"Authorization: Bearer {h.KEY}",)
        steady, loaded, swaps = [], [], []
        builds_before = len(build_times(out))
        for _ in range(args.rounds):
            steady.append(h.measure(url, [pid], args, auth))
            show("no reload", steady[-1])
            stop = threading.Event()
            count = [0]
            pending = [None]

            def storm():
                while not stop.is_set():
                    before = published(out)
                    writer.write()
                    pending[0] = before
                    while not stop.is_set() and published(out) == before:
                        time.sleep(0.02)
                    if published(out) > before:
                        count[0] += 1
                        pending[0] = None
            t = threading.Thread(target=storm)
            t.start()
            try:
                loaded.append(h.measure(url, [pid], args, auth))
            finally:
                stop.set()
                t.join()
            swaps.append(count[0])
            show(f"rebuilding ({count[0]} swaps)", loaded[-1])
            # The last write's rebuild ends before the next quiet run starts.
            if pending[0] is not None:
                wait_published(out, pending[0])
            time.sleep(1)
        under_load_ms = build_times(out)[builds_before:]
        result.update(steady=steady, loaded=loaded, swaps=swaps, under_load_build_ms=under_load_ms,
                      rss_end_kib=h.rss_kib(pid), peak_end_kib=hwm_kib(pid),
                      log_errors=(out / "gateway.log").read_text().count("reload failed"))
    finally:
        h.PIN["server"] = server_pin
        s.stop()
    report(args, result, h)
    return result


def report(args, r, h):
    med = h.med
    q = r["quiet"]
    st, lo = r["steady"], r["loaded"]
    failed = lambda rs: sum(x["socket_errors"] + x["non2xx"] for x in rs)
    builds = ", ".join(str(x["build_ms"]) for x in q)
    walls = ", ".join(f"{x['wall_s']:.1f}" for x in q)
    rss = ", ".join(f"{x['rss_kib'] / 1024:.0f}" for x in q)
    print(f"\nbigtable, {args.entries} names: start {r['start_s']:.2f} s (build {r['start_build_ms']} ms), "
          f"RSS {r['rss_start_kib'] / 1024:.0f} MiB; rebuilds {builds} ms (write to swap {walls} s); "
          f"RSS after reloads {rss} MiB; peak {r['peak_kib'] / 1024:.0f} MiB")
    print(f"under load: steady {med(st, 'rps'):.0f} req/s p99 {med(st, 'p99_us'):.0f} us; with rebuilds "
          f"{med(lo, 'rps'):.0f} req/s p99 {med(lo, 'p99_us'):.0f} us ({sum(r['swaps'])} swaps, builds "
          f"{r['under_load_build_ms']} ms); failed {failed(st)} / {failed(lo)}; reload failures logged "
          f"{r['log_errors']}; RSS at the end {r['rss_end_kib'] / 1024:.0f} MiB, peak {r['peak_end_kib'] / 1024:.0f} MiB")
    print("\n| | req/s | p50 us | p99 us | p99.99 us | failed |\n|---|---:|---:|---:|---:|---:|")
    for name, rs in (("no reload", st), ("rebuilding", lo)):
        print(f"| {name} | {med(rs, 'rps'):.0f} | {med(rs, 'p50_us'):.0f} | {med(rs, 'p99_us'):.0f} | "
              f"{med(rs, 'p9999_us'):.0f} | {failed(rs)} |")
    print(f"\np99 rebuilding / no reload: {med(lo, 'p99_us') / max(med(st, 'p99_us'), 1):.2f}x")
