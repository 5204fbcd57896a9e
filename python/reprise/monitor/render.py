"""What ``reprise info`` and ``reprise top`` show, as plain numbers and as text.

The rendering is pure: ``figures(snapshot, previous)`` turns one snapshot (the dict of
``client.snapshot()``, and the one before it, for rates) into plain numbers, and
``render_text`` (``info``), ``render_json`` and ``top``'s ``render_rich`` lay those out with
the helpers here. Rates come from the table's ``rates`` extension (items/s over the last 10
complete seconds) when it is attached, else from the difference of two snapshots'
``num_inserts`` and ``num_samples`` over their ``time`` (``top`` only: one snapshot has no
rate). Table and client names are arbitrary text: they are shown literally (never read as
rich markup), with control characters escaped (``printable``) so that a name cannot move the
cursor or recolour the terminal.
"""

from __future__ import annotations

import json
import math
import unicodedata

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 16


# --- figures -----------------------------------------------------------------------------------


def figures(snapshot: dict, previous: dict | None = None) -> dict:
    """The numbers ``info`` and ``top`` show, from ``snapshot`` (and ``previous``, an earlier
    snapshot of the same server, for rates the snapshot does not carry)."""
    dt = None
    if previous is not None:
        dt = snapshot.get("time", 0.0) - previous.get("time", 0.0)
        if not dt > 0:
            dt = None
    before = {t.get("name"): t for t in (previous or {}).get("tables", [])} if dt else {}
    tables = [_table_figures(t, before.get(t.get("name")), dt) for t in snapshot.get("tables", [])]
    clients_before = {c.get("id"): c for c in (previous or {}).get("clients", [])} if dt else {}
    clients = [_client_figures(c, clients_before.get(c.get("id")), dt) for c in snapshot.get("clients", [])]
    data = snapshot.get("bytes") or {}
    old = (previous or {}).get("bytes") or {}
    server = snapshot.get("server") or {}
    return {
        "name": server.get("name"), "address": server.get("address"), "version": snapshot.get("version"),
        "time": snapshot.get("time"), "uptime_seconds": snapshot.get("uptime_seconds"),
        "tables": tables, "clients": clients,
        "bytes_received": data.get("received"), "bytes_sent": data.get("sent"),
        "bytes_received_rate": _diff_rate(data.get("received"), old.get("received"), dt),
        "bytes_sent_rate": _diff_rate(data.get("sent"), old.get("sent"), dt),
    }


def _diff_rate(now, then, dt):
    if dt is None or now is None or then is None or now < then:
        return None  # no interval, or a counter that went back (a restarted server)
    return (now - then) / dt


def _table_figures(t: dict, before: dict | None, dt: float | None) -> dict:
    stats = t.get("stats") or {}
    limiter = t.get("rate_limiter") or {}
    rates = stats.get("rates")
    if rates is not None:
        insert_rate, sample_rate = rates.get("insert_rate"), rates.get("sample_rate")
    else:
        insert_rate = _diff_rate(t.get("num_inserts"), (before or {}).get("num_inserts"), dt)
        sample_rate = _diff_rate(t.get("num_samples"), (before or {}).get("num_samples"), dt)
    blocked_before = (before or {}).get("rate_limiter") or {}
    age = stats.get("sampled_age") or {}
    unique = stats.get("unique_samples") or {}
    size, max_size = t.get("size"), t.get("max_size")
    return {
        "name": t.get("name", ""), "size": size, "max_size": max_size,
        "fill": size / max_size if size is not None and max_size else None,
        "num_inserts": t.get("num_inserts"), "num_samples": t.get("num_samples"),
        "insert_rate": insert_rate, "sample_rate": sample_rate,
        "blocked_insert_seconds": limiter.get("blocked_insert_seconds"),
        "blocked_sample_seconds": limiter.get("blocked_sample_seconds"),
        # Seconds blocked per second of wall time (shown as a percentage): 1.0 = one caller
        # blocked all along, 2.0 = two.
        "blocked_insert_share": _diff_rate(limiter.get("blocked_insert_seconds"),
                                           blocked_before.get("blocked_insert_seconds"), dt),
        "blocked_sample_share": _diff_rate(limiter.get("blocked_sample_seconds"),
                                           blocked_before.get("blocked_sample_seconds"), dt),
        "age_inserts": age.get("mean_inserts"), "age_seconds": age.get("mean_seconds"),
        "unique_fraction": unique.get("fraction"), "unique_window": unique.get("window"),
        "unique_current": unique.get("current"), "unique_current_draws": unique.get("current_draws"),
        "priorities": _histogram(stats.get("priority_histogram")),
    }


def _client_figures(c: dict, before: dict | None, dt: float | None) -> dict:
    def total(client, key):
        return sum((client.get(key) or {}).values())

    return {
        "id": c.get("id"), "kind": c.get("kind", ""), "peer": c.get("peer", ""),
        "connected_seconds": c.get("connected_seconds"), "inserts": c.get("inserts") or {},
        "samples": c.get("samples") or {}, "total_inserts": total(c, "inserts"), "total_samples": total(c, "samples"),
        "insert_rate": _diff_rate(total(c, "inserts"), total(before, "inserts"), dt) if before else None,
        "sample_rate": _diff_rate(total(c, "samples"), total(before, "samples"), dt) if before else None,
    }


def _histogram(h: dict | None) -> dict | None:
    """``{"low", "high", "spark"}`` of a spec histogram (None when absent, spark "" when empty)."""
    if h is None:
        return None
    bounds, counts = h.get("bounds") or [], h.get("counts") or []
    if not counts:
        return {"low": None, "high": None, "spark": "", "total": h.get("total", 0)}
    return {"low": bounds[0], "high": bounds[-1], "spark": sparkline(counts), "total": h.get("total", sum(counts))}


def sparkline(counts: list[int], width: int = SPARK_WIDTH) -> str:
    """One character per bucket (adjacent buckets summed to fit ``width``), height by count
    relative to the largest; an empty bucket is a space."""
    if not counts:
        return ""
    group = max(1, math.ceil(len(counts) / width))
    merged = [sum(counts[i:i + group]) for i in range(0, len(counts), group)]
    top = max(merged)
    if top <= 0:
        return " " * len(merged)
    return "".join(" " if c <= 0 else SPARK[max(0, math.ceil(c / top * len(SPARK)) - 1)] for c in merged)


# --- formatting --------------------------------------------------------------------------------


def printable(text) -> str:
    """``text`` with control and format characters escaped (``\\x1b``, ``\\n``...): a name is
    shown as it is, but cannot drive the terminal."""
    text = str(text)
    if not any(_control(c) for c in text):
        return text
    return "".join((repr(c)[1:-1] if c.isascii() else f"\\u{ord(c):04x}") if _control(c) else c for c in text)


def _control(c: str) -> bool:
    category = unicodedata.category(c)
    return category[0] == "C" or category in ("Zl", "Zp")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _count(n) -> str:
    if n is None:
        return "-"
    if abs(n) < 100_000:
        return f"{n:,}" if isinstance(n, int) else f"{n:,.0f}"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _rate(x) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if x < 100 else _count(round(x))


def _seconds(s) -> str:
    if s is None:
        return "-"
    if s == 0:
        return "0s"
    if s < 0.1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.2f}s" if s < 1 else f"{s:.1f}s"
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _percent(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _bound(x) -> str:
    return "0" if x == 0 else f"{x:.3g}"


def _size(t: dict) -> str:
    return f"{_count(t['size'])}/{_count(t['max_size'])}"


def _blocked(total, share) -> str:
    if total is None:
        return "-"
    return _seconds(total) + ("" if share is None else f" ({_percent(share)})")


def _age(t: dict) -> str:
    if t["age_inserts"] is None and t["age_seconds"] is None:
        return "-"
    inserts = "-" if t["age_inserts"] is None else f"{t['age_inserts']:.3g}"
    return f"{inserts} ins, {_seconds(t['age_seconds'])}"


def _unique(t: dict) -> str:
    """The fraction of the last complete window; before the first one completes, ``~`` and
    the fraction so far."""
    if t["unique_fraction"] is None and t["unique_current_draws"]:
        return "~" + _percent(t["unique_current"] / t["unique_current_draws"])
    return _percent(t["unique_fraction"])


def _unique_text(t: dict) -> str:
    if t["unique_window"] is None:
        return "-"
    window = _count(t["unique_window"])
    if t["unique_fraction"] is not None:
        return f"{_percent(t['unique_fraction'])} of the last {window} draws distinct"
    return (f"- (the first window of {window} draws is not complete: {_count(t['unique_current'] or 0)} "
            f"distinct in {_count(t['unique_current_draws'] or 0)} so far)")


def _priorities(t: dict) -> tuple[str, str]:
    """(range, sparkline) of the table's priorities."""
    h = t["priorities"]
    if h is None:
        return "-", ""
    if not h["spark"]:
        return "empty", ""
    return f"{_bound(h['low'])}..{_bound(h['high'])}", h["spark"]


def _server_line(f: dict) -> str:
    where = []
    if f["name"] is not None:
        where.append(f"local {printable(f['name'])}")
    if f["address"] is not None:
        where.append(f"remote {printable(f['address'])}")
    return (f"server  {', '.join(where) or '-'}   reprise {f['version'] or '-'}   up {_seconds(f['uptime_seconds'])}"
            f"   {len(f['tables'])} table(s), {len(f['clients'])} client(s)")


def _bytes_line(f: dict) -> str:
    def one(n, rate):
        return _bytes(n) + ("" if rate is None else f" ({_bytes(rate)}/s)")
    return (f"bytes   received {one(f['bytes_received'], f['bytes_received_rate'])}, "
            f"sent {one(f['bytes_sent'], f['bytes_sent_rate'])}")


# --- info: text and JSON -----------------------------------------------------------------------


def render_text(snapshot: dict, previous: dict | None = None) -> str:
    """``reprise info``'s text: the server, then a block per table, then the clients."""
    f = figures(snapshot, previous)
    lines = [_server_line(f), _bytes_line(f), ""]
    for t in f["tables"]:
        fill = "" if t["fill"] is None else f" ({_percent(t['fill'])} full)"
        low_high, spark = _priorities(t)
        lines += [
            f"table {printable(t['name'])}",
            f"  size          {_size(t)}{fill}",
            f"  inserts       {_count(t['num_inserts'])} total, {_rate(t['insert_rate'])}/s",
            f"  samples       {_count(t['num_samples'])} total, {_rate(t['sample_rate'])}/s",
            f"  blocked       inserts {_blocked(t['blocked_insert_seconds'], t['blocked_insert_share'])}, "
            f"samples {_blocked(t['blocked_sample_seconds'], t['blocked_sample_share'])} (rate limiter, total)",
            f"  sampled age   {_age(t)} (mean)",
            f"  unique        {_unique_text(t)}",
            f"  priorities    {low_high} {spark}".rstrip(),
            "",
        ]
    if not f["clients"]:
        lines.append("clients none")
    else:
        lines.append("clients")
        for c in f["clients"]:
            per_table = ", ".join(f"{printable(k)} {_count(v)}" for k, v in c["inserts"].items() if v)
            drawn = ", ".join(f"{printable(k)} {_count(v)}" for k, v in c["samples"].items() if v)
            lines.append(f"  #{c['id']} {c['kind']} {printable(c['peer'])}, connected {_seconds(c['connected_seconds'])}: "
                         f"inserts {per_table or 0}; samples {drawn or 0}")
    return "\n".join(lines)


def finite(value):
    """``value`` with non-finite floats (a rate limiter's unbounded ``min_diff``/``max_diff``)
    as None, so that the JSON is strict JSON (``null``) that any parser reads."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def render_json(snapshot: dict) -> str:
    return json.dumps(finite(snapshot), indent=2, allow_nan=False)
