"""``reprise top``: a snapshot redrawn every ``--interval`` seconds with ``rich``.

``render_rich`` lays out ``figures``' numbers as two grids of tables (what flows in and out,
then what is drawn) and one of clients; every name is a ``Text``, never parsed as markup.
``_top`` is the refresh loop: it draws in the terminal's alternate screen, reads single keys
(``_Keys``, cbreak) until ``q`` or Ctrl-C, reconnects after a lost connection, and puts the
terminal back as it found it, also on SIGTERM or an error.
"""

from __future__ import annotations

import os
import sys
import time

from .render import (_age, _blocked, _bytes_line, _count, _one_line, _priorities, _rate, _seconds, _server_line,
                      _size, _unique, figures, printable)


# --- top: rich ---------------------------------------------------------------------------------


def render_rich(snapshot: dict | None, previous: dict | None = None, status: str | None = None,
                interval: float = 1.0):
    """``reprise top``'s screen: a renderable for ``rich``. Every name is a ``Text`` (never
    parsed as markup). ``status``: a line in red (a lost connection)."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts = []
    if snapshot is None:
        parts.append(Text("waiting for the first snapshot...", style="dim"))
    else:
        f = figures(snapshot, previous)
        parts += [Text(_server_line(f), style="bold"), Text(_bytes_line(f)), Text("")]
        names = [Text(printable(t["name"]), style="bold") for t in f["tables"]]
        name_width = min(16, max([len(n) for n in names] + [5]))

        def grid(*columns):
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
            table.add_column(Text("table"), min_width=name_width, overflow="fold")
            for header in columns:
                table.add_column(Text(header), justify="right" if header != "priorities" else "left", no_wrap=True)
            return table

        # Two grids, each fitting 80 columns: what flows in and out, then what is drawn.
        flow = grid("size/max", "insert/s", "sample/s", "blocked ins", "blocked smp")
        drawn = grid("sampled age", "unique", "priorities")
        for name, t in zip(names, f["tables"]):
            full = t["fill"] is not None and t["fill"] >= 1.0
            flow.add_row(name, Text(_size(t), style="green" if full else ""),
                         Text(_rate(t["insert_rate"])), Text(_rate(t["sample_rate"])),
                         Text(_blocked(t["blocked_insert_seconds"], t["blocked_insert_share"]),
                              style="yellow" if (t["blocked_insert_share"] or 0) > 0.05 else ""),
                         Text(_blocked(t["blocked_sample_seconds"], t["blocked_sample_share"]),
                              style="yellow" if (t["blocked_sample_share"] or 0) > 0.05 else ""))
            low_high, spark = _priorities(t)
            prio = Text(low_high + " ")
            prio.append(spark, style="cyan")
            drawn.add_row(name, Text(_age(t)), Text(_unique(t)), prio)
        parts += [flow, Text(""), drawn, Text("")]
        if f["clients"]:
            clients = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
            peers = [Text(printable(c["peer"])) for c in f["clients"]]
            for header in ("client", "peer", "connected", "inserts", "ins/s", "samples", "smp/s"):
                clients.add_column(Text(header), justify="left" if header in ("client", "peer") else "right",
                                   no_wrap=header != "peer", overflow="fold",
                                   min_width=min(21, max(len(p) for p in peers)) if header == "peer" else None)
            for c, peer in zip(f["clients"], peers):
                clients.add_row(Text(f"{c['id']} {printable(c['kind'])}"), peer, Text(_seconds(c["connected_seconds"])),
                                Text(_count(c["total_inserts"])), Text(_rate(c["insert_rate"])),
                                Text(_count(c["total_samples"])), Text(_rate(c["sample_rate"])))
            parts.append(clients)
        else:
            parts.append(Text("no clients connected", style="dim"))
    if status:
        parts.append(Text(status, style="bold red"))
    when = time.strftime("%H:%M:%S", time.localtime(snapshot["time"])) if snapshot and "time" in snapshot else "-"
    parts.append(Text(f"q quits · every {interval:g}s · last snapshot {when}", style="dim"))
    return Group(*parts)


class _Keys:
    """Single keys from stdin without echo or Enter (cbreak: Ctrl-C still raises
    KeyboardInterrupt); the terminal's settings are restored on close. Without a terminal on
    stdin, only the wait."""

    def __init__(self):
        self._fd = None
        self._saved = None
        try:
            if sys.stdin.isatty():
                import termios
                import tty
                self._fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(self._fd)
                tty.setcbreak(self._fd)
        except (OSError, ValueError, AttributeError):
            self._fd = None

    def wait(self, seconds: float) -> str:
        """Waits up to ``seconds`` for input; returns what was typed ('' if nothing)."""
        import select
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._fd is None:
                time.sleep(left)
                return ""
            ready, _, _ = select.select([self._fd], [], [], left)
            if ready:
                data = os.read(self._fd, 64)
                if not data:  # end of input: nothing more will come
                    self._fd = None
                    continue
                return data.decode(errors="replace")
        return ""

    def close(self):
        if self._saved is not None:
            import termios
            termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, self._saved)
            self._saved = None


def _top(a) -> int:
    import signal

    from rich.console import Console
    from rich.live import Live

    from ..errors import RepriseError
    # Looked up on the package when called, not bound at import: the package imports this
    # module, and its ``connect``/``fetch`` are the ones to use (a test replaces them).
    from . import Unreachable, _close, _unreachable, connect, fetch

    client = connect(a.address, a.token, a.tls, a.tls_ca, a.tls_domain, a.connect_timeout)
    try:
        current = fetch(client)
    except BaseException as e:
        _close(client)
        raise _unreachable(a.address, client.address.startswith("unix://"), e) from None
    console = Console()
    if not console.is_terminal:
        _close(client)
        raise Unreachable("needs a terminal to draw in; use 'reprise info ADDRESS' (or --json) for one snapshot")
    previous, status = None, None

    def terminate(signum, frame):
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, terminate)
    keys = _Keys()
    try:
        with Live(render_rich(current, None, None, a.interval), console=console, screen=True,
                  auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
            while True:
                typed = keys.wait(a.interval)
                if "q" in typed.lower():
                    return 0
                if typed:
                    continue  # another key: redraw at the next tick
                try:
                    if client is None:
                        client = connect(a.address, a.token, a.tls, a.tls_ca, a.tls_domain, a.connect_timeout)
                    snapshot = fetch(client)
                    previous, current, status = current, snapshot, None
                except (RepriseError, Unreachable) as e:
                    status = f"no snapshot at {time.strftime('%H:%M:%S')}: {_one_line(e)}; retrying"
                    if client is not None and not isinstance(e, Unreachable):
                        _close(client)
                        client = None
                live.update(render_rich(current, previous, status, a.interval), refresh=True)
    except KeyboardInterrupt:
        return 0
    finally:
        keys.close()
        signal.signal(signal.SIGTERM, old_term)
        if client is not None:
            _close(client)

