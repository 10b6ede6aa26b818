"""The realistic mix for callgrind: the load harness's seeded stream (benches/load/harness.py
`mix_stream`: 55% free providers, 30% company domains, 10% listed names, 5% invalid), cut to a
warm-up and a measured run, with the companies' DNS zones for the loopback DNS server.

    python3 benches/callgrind/mix.py OUT_DIR N     writes OUT_DIR/{warm,run,zones}.txt
"""
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "load"))
import harness  # noqa: E402

out, n = Path(sys.argv[1]), int(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
args = types.SimpleNamespace(seed=42, dns_ttl=300, mix_repeat=0.9, entries=10_000)
harness.MIX_SLICE = 2 * n + 1_000
(paths,), zones, _, _ = harness.mix_stream(args, 1)
# The warm-up fills the MX cache with the companies seen before, as a gateway in service has it.
(out / "warm.txt").write_text("\n".join(paths[: n + 1_000]) + "\n")
(out / "run.txt").write_text("\n".join(paths[n + 1_000:]) + "\n")
(out / "zones.txt").write_text("\n".join(zones) + "\n")
