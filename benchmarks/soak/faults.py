"""Faults the driver injects besides SIGKILLs: malformed connections and refused tokens.

Each function makes one attempt and returns a small dict for the report; none of them can
block for long (every socket has a timeout, every client a connect timeout).
"""

from __future__ import annotations

import random
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HOLD_S = 1.0  # how long a malformed connection stays open waiting for the server to close it

MALFORMED = ["garbage", "truncated_preface", "preface_bad_frame", "preface_huge_frame", "http1",
             "connect_close", "silent"]


def _frame(length: int, kind: int, flags: int, stream: int) -> bytes:
    """An HTTP/2 frame header (RFC 9113 section 4.1)."""
    return struct.pack(">I", length)[1:] + bytes([kind, flags]) + struct.pack(">I", stream & 0x7FFFFFFF)


def malformed(address: str, kind: str, rng: random.Random) -> dict:
    """One connection to the gRPC port that sends ``kind`` of bad bytes, then waits up to
    ``HOLD_S`` for the server to close it (reading what it answers) and closes it."""
    host, port = address.rsplit(":", 1)
    if kind == "garbage":
        data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 2048)))
    elif kind == "truncated_preface":
        data = PREFACE[:rng.randint(1, len(PREFACE) - 1)]
    elif kind == "preface_bad_frame":
        body = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        data = PREFACE + _frame(len(body), rng.randint(0, 255), rng.getrandbits(8), rng.getrandbits(31)) + body
    elif kind == "preface_huge_frame":   # a SETTINGS frame claiming 16 MiB, then nothing
        data = PREFACE + _frame((1 << 24) - 1, 0x4, 0, 0) + b"\0" * 12
    elif kind == "http1":
        data = b"POST /reprise.v1.Replay/Insert HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    elif kind in ("connect_close", "silent"):
        data = b""
    else:
        raise ValueError(f"unknown malformed kind {kind!r}")
    out = {"kind": kind, "sent": len(data), "closed_by_server": False, "answered": 0, "error": None}
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=2.0) as s:
            if kind == "connect_close":
                return out
            s.sendall(data)
            s.settimeout(0.1)
            while time.monotonic() - t0 < HOLD_S:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                if not chunk:
                    out["closed_by_server"] = True
                    break
                out["answered"] += len(chunk)
    except OSError as e:   # refused while the server restarts, reset by the server
        out["error"] = type(e).__name__
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def wrong_token(rp, address: str, token: str, rng: random.Random, connect_timeout: float) -> dict:
    """One client with a token that is not the server's: it must be refused (Unauthenticated)."""
    kind = rng.choice(["wrong", "missing", "prefix", "extended", "case"])
    bad = {"wrong": f"wrong-{rng.getrandbits(32):08x}", "missing": None, "prefix": token[:-1],
           "extended": token + "x", "case": token.upper() if token.upper() != token else token.lower()}[kind]
    out = {"kind": kind, "outcome": None}
    t0 = time.monotonic()
    try:
        c = rp.Client(address, token=bad, connect_timeout=connect_timeout)
        try:
            c.info()
            out["outcome"] = "accepted"   # a bug: the server served a wrong token
        except rp.errors.Unauthenticated:
            out["outcome"] = "refused"
        finally:
            c.close()
    except rp.errors.Unauthenticated:
        out["outcome"] = "refused"
    except rp.errors.RepriseError as e:   # the server is down (it restarts once)
        out["outcome"] = "unreachable"
        out["error"] = str(e)[:120]
    out["seconds"] = round(time.monotonic() - t0, 3)
    out["limit"] = connect_timeout
    return out
