"""Where a server's CPU goes over one round, beyond the instructions callgrind counts: `perf stat`
on its threads (syscalls by name, context switches, the wake-ups it causes, page faults) and
/proc's user and kernel time per thread, each a request.

Counting tracepoints costs a little on every syscall, so the harness runs the probe in a round of
its own, outside the medians it reports."""

import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path

# The syscalls a request can make; the rest are counted together as "other".
SYSCALLS = ("epoll_wait", "recvfrom", "read", "sendto", "write", "writev", "futex", "epoll_ctl",
            "accept4", "close", "madvise", "mmap", "munmap", "mprotect", "sched_yield")
EVENTS = (["task-clock", "context-switches", "page-faults", "raw_syscalls:sys_enter", "sched:sched_wakeup"]
          + [f"syscalls:sys_enter_{s}" for s in SYSCALLS])


def role(comm):
    """A thread's role from its name: numbers dropped, so every worker of a pool is one role."""
    return re.sub(r"[-_ ]*\d+$", "", comm).strip() or comm


def threads(pids):
    """tid -> (role, user s, system s, voluntary switches, involuntary switches)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                comm = (task / "comm").read_text().strip()
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                status = dict(l.split(":", 1) for l in (task / "status").read_text().splitlines() if ":" in l)
            except (FileNotFoundError, ProcessLookupError):
                continue
            out[task.name] = (role(comm), int(fields[11]) / tick, int(fields[12]) / tick,
                              int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]))
    return out


class Probe:
    """`perf stat --per-thread` on `pids` from construction to `finish`."""

    def __init__(self, pids):
        self.pids = list(pids)
        self.before = threads(self.pids)
        self.file = tempfile.NamedTemporaryFile(prefix="drg-perf-", suffix=".csv", delete=False).name
        self.perf = subprocess.Popen(
            ["perf", "stat", "-x,", "--per-thread", "-p", ",".join(map(str, self.pids)),
             "-e", ",".join(EVENTS), "-o", self.file],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def finish(self, requests):
        """The round's figures a request: totals by event and, per thread role, CPU us (user and
        kernel), switches and syscalls."""
        after = threads(self.pids)
        self.perf.send_signal(signal.SIGINT)
        self.perf.wait(timeout=30)
        n = max(requests, 1)
        totals, by_role = {}, {}
        for line in Path(self.file).read_text().splitlines():
            parts = line.split(",")
            if len(parts) < 4 or line.startswith("#"):
                continue
            comm, value, event = parts[0], parts[1], parts[3]
            try:
                v = float(value)
            except ValueError:
                continue  # "<not counted>"
            event = event.replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "syscalls")
            totals[event] = totals.get(event, 0) + v
            r = by_role.setdefault(role(comm.rsplit("-", 1)[0]), {})
            r[event] = r.get(event, 0) + v
        os.unlink(self.file)
        per_req = {k: v / n for k, v in totals.items()}
        per_req["other"] = per_req.get("syscalls", 0) - sum(per_req.get(s, 0) for s in SYSCALLS)
        roles = {}
        for tid, (name, user, system, vcs, ivcs) in after.items():
            b = self.before.get(tid, (name, 0, 0, 0, 0))
            r = roles.setdefault(name, {"user_us": 0, "sys_us": 0, "switches": 0})
            r["user_us"] += (user - b[1]) * 1e6 / n
            r["sys_us"] += (system - b[2]) * 1e6 / n
            r["switches"] += ((vcs - b[3]) + (ivcs - b[4])) / n
        for name, r in roles.items():
            counted = by_role.get(name, {})
            r["syscalls"] = counted.get("syscalls", 0) / n
            r["wakeups"] = counted.get("sched:sched_wakeup", 0) / n
        return {"per_req": per_req, "roles": roles}


def table(results):
    """Markdown: one row a server (syscalls and switches a request), then one a gateway thread."""
    cols = ["syscalls", "epoll_wait", "recvfrom", "read", "sendto", "write", "writev", "futex", "other",
            "context-switches", "sched:sched_wakeup", "page-faults"]
    heads = ["syscalls", "epoll_wait", "recvfrom", "read", "sendto", "write", "writev", "futex", "other",
             "switches", "wake-ups", "page faults"]
    lines = ["| server | cpu us/req (user + kernel) | " + " | ".join(heads) + " |",
             "|---|---:|" + "---:|" * len(heads)]
    for who, b in results.items():
        user = sum(r["user_us"] for r in b["roles"].values())
        system = sum(r["sys_us"] for r in b["roles"].values())
        lines.append(f"| {who} | {user + system:.2f} ({user:.2f} + {system:.2f}) | "
                     + " | ".join(f"{b['per_req'].get(c, 0):.3f}" for c in cols) + " |")
    return lines


def thread_table(b):
    """Markdown: a server's threads by role, a request."""
    lines = ["| thread | user us | kernel us | share of CPU | switches | syscalls | wake-ups caused |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    total = sum(r["user_us"] + r["sys_us"] for r in b["roles"].values()) or 1
    rows = sorted(b["roles"].items(), key=lambda kv: -(kv[1]["user_us"] + kv[1]["sys_us"]))
    # Threads under 0.1% of the CPU (timers and tickers, most of them idle) as one row.
    shown = [(n, r) for n, r in rows if (r["user_us"] + r["sys_us"]) / total >= 0.001]
    rest = [r for n, r in rows if (r["user_us"] + r["sys_us"]) / total < 0.001]
    if rest:
        shown.append((f"{len(rest)} others", {k: sum(r[k] for r in rest) for k in rest[0]}))
    for name, r in shown:
        lines.append(f"| `{name}` | {r['user_us']:.2f} | {r['sys_us']:.2f} | "
                     f"{(r['user_us'] + r['sys_us']) / total:.1%} | {r['switches']:.4f} | "
                     f"{r['syscalls']:.3f} | {r['wakeups']:.3f} |")
    return lines
