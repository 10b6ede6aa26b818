#!/usr/bin/env python3
"""Verifies a domain-risk-gateway webhook (quota alerts, verdict changes) as a receiver should.

The gateway sends `Webhook-Signature: t=<unix seconds>,v1=<hex>`, where <hex> is the
HMAC-SHA256, under the shared secret, of `<t>.<raw body>`. Accept a message only when the
signature matches (compared in constant time) and `t` is within TOLERANCE seconds of your clock:
a message captured on the way and sent again later is refused. Deduplicate what you accept by
its `X-Alert-Id` / `X-Change-Id` (a retry repeats the id with a new `t`).

As a library: `verify(secret, header, body)`. As a command (the tests use it):
    verify.py --secret-file FILE --header 'Webhook-Signature value' [--now UNIX] < body
exits 0 when the message is accepted, 1 (saying why) when refused.
"""
import argparse
import hashlib
import hmac
import sys
import time

TOLERANCE = 300  # seconds; the gateway's clock and yours should agree to well within this


def verify(secret: bytes, header: str, body: bytes, now: float = None, tolerance: int = TOLERANCE):
    """(accepted, why)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
        given = parts["v1"]
    except (KeyError, ValueError):
        return False, "no t= and v1= in the header"
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        return False, "the signature does not match"
    now = time.time() if now is None else now
    if abs(now - t) > tolerance:
        return False, f"stale: sent at {t}, {int(now - t)} s from now (more than {tolerance} s)"
    return True, "accepted"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--secret-file", required=True)
    ap.add_argument("--header", required=True, help="the Webhook-Signature header's value")
    ap.add_argument("--now", type=float, help="the receiver's clock (default: now)")
    args = ap.parse_args()
    # The gateway reads the first line of its secret file, trimmed: so does this.
    with open(args.secret_file, "rb") as f:
        secret = (f.read().splitlines() or [b""])[0].strip()
    ok, why = verify(secret, args.header, sys.stdin.buffer.read(), args.now)
    print(why)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
