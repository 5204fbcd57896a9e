"""`reprise info` and `reprise top` (issue 16): the rendering of a snapshot (synthetic, built as
the spec of ``client.snapshot()`` says), the commands against served tables, and `top` in a real
terminal (tmux: send-keys, capture-pane). Every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

import reprise as rp
from reprise import monitor

TMUX = shutil.which("tmux")
HAS_SNAPSHOT = hasattr(rp.Client, "snapshot")
needs_snapshot = pytest.mark.skipif(not HAS_SNAPSHOT, reason="rp.Client.snapshot() is not built yet (issue 16)")
needs_tmux = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")

MARKUP = "[bold]x[/]"
HTML = "<img src=x onerror=alert(1)>"


def histogram(bounds, counts):
    return {"bounds": list(bounds), "counts": list(counts), "total": sum(counts)}


def table_entry(name, size=10, max_size=100, num_inserts=50, num_samples=200, stats=True, blocked=(1.5, 0.25)):
    t = {
        "name": name, "size": size, "max_size": max_size, "max_times_sampled": 0, "sampler": "Prioritized(0.6)",
        "remover": "Fifo()", "num_inserts": num_inserts, "num_samples": num_samples, "num_evictions": 0,
        "num_deletes": 0, "num_store_evictions": 0,
        "rate_limiter": {"samples_per_insert": 4.0, "min_size_to_sample": 1, "min_diff": float("-inf"),
                         "max_diff": float("inf"), "inserts": num_inserts, "samples": num_samples,
                         "blocked_insert_seconds": blocked[0], "blocked_sample_seconds": blocked[1]},
    }
    t["stats"] = {} if not stats else {
        "priority_histogram": histogram([0.25, 0.5, 1.0, 2.0, 4.0], [1, 0, 6, 3]),
        "sampled_age": {"count": num_samples, "inserts": histogram([0, 1, 2, 4], [5, 10, 20]),
                        "seconds": histogram([0.5, 1, 2], [3, 4]), "mean_inserts": 12.5, "mean_seconds": 0.75},
        "times_sampled": histogram([0, 1, 2], [3, 7]),
        "unique_samples": {"window": 100, "fraction": 0.875, "windows": 2, "current": 3, "current_draws": 4},
        "rates": {"seconds": 60, "inserts": [0] * 59 + [3], "samples": [0] * 59 + [9], "insert_rate": 12.0,
                  "sample_rate": 48.0},
    }
    return t


def snapshot(time_=1000.0, tables=None, clients=None, received=2048, sent=1 << 20):
    return {
        "version": rp.__version__, "time": time_, "uptime_seconds": 3725.0,
        "server": {"name": "monitor-test", "address": "127.0.0.1:4000"},
        "tables": tables if tables is not None else [table_entry("replay"), table_entry(MARKUP, stats=False),
                                                     table_entry(HTML, size=0)],
        "clients": clients if clients is not None else [
            {"id": 1, "kind": "remote", "peer": "10.0.0.2:5555", "connected_seconds": 42.0,
             "inserts": {"replay": 30, MARKUP: 5}, "samples": {"replay": 100}},
            {"id": 2, "kind": "local", "peer": "pid 1234", "connected_seconds": 7.5, "inserts": {},
             "samples": {HTML: 8}},
        ],
        "bytes": {"received": received, "sent": sent},
    }


def rich_text(renderable, width=200):
    from rich.console import Console
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable)
    return console.export_text()


# --- rendering ---------------------------------------------------------------------------------


def test_text_shows_every_table_with_its_figures_and_names_literally():
    out = monitor.render_text(snapshot())
    for name in ("replay", MARKUP, HTML):
        assert f"table {name}" in out.splitlines(), (name, out)
    assert "10/100 (10% full)" in out
    assert "50 total, 12.0/s" in out and "200 total, 48.0/s" in out  # the rates extension's rates
    assert "inserts 1.5s, samples 0.25s" in out
    assert "12.5 ins, 0.75s (mean)" in out
    assert "88% of the last 100 draws distinct" in out
    assert "0.25..4" in out and "▂ █▄" in out  # bucket [0.5, 1) is empty: a gap
    assert "#1 remote 10.0.0.2:5555" in out and "#2 local pid 1234" in out
    assert "received 2.0 KiB, sent 1.0 MiB" in out
    assert "up 1h02m" in out and "local monitor-test, remote 127.0.0.1:4000" in out


def test_a_table_without_extensions_shows_dashes_and_no_clients_is_said():
    out = monitor.render_text(snapshot(tables=[table_entry("bare", stats=False)], clients=[]))
    block = out.split("table bare", 1)[1]
    assert "50 total, -/s" in block and "sampled age   - (mean)" in block and "priorities    -" in block
    assert "unique        -\n" in block


def test_unique_fraction_before_the_first_window_completes_shows_the_fraction_so_far():
    t = table_entry("t")
    t["stats"]["unique_samples"] = {"window": 10_000, "fraction": None, "windows": 0, "current": 90,
                                    "current_draws": 120}
    out = monitor.render_text(snapshot(tables=[t], clients=[]))
    assert "the first window of 10,000 draws is not complete: 90 distinct in 120 so far" in out
    assert "~75%" in rich_text(monitor.render_rich(snapshot(tables=[t])))
    assert "clients none" in out


def test_rich_screen_shows_every_table_and_client_with_markup_shown_literally():
    out = rich_text(monitor.render_rich(snapshot()))
    for text in ("replay", MARKUP, HTML, "10.0.0.2:5555", "pid 1234", "12.0", "48.0", "88%", "▂ █▄"):
        assert text in out, (text, out)
    assert "q quits" in out


def test_rates_without_the_rates_extension_come_from_two_snapshots():
    def bare(n_ins, n_smp, blocked):
        return [table_entry("t", num_inserts=n_ins, num_samples=n_smp, stats=False, blocked=(blocked, 0.0))]

    before = snapshot(time_=100.0, tables=bare(100, 400, 1.0), received=1000, sent=0)
    after = snapshot(time_=102.0, tables=bare(160, 500, 2.0), received=5096, sent=0)
    f = monitor.figures(after, before)
    t = f["tables"][0]
    assert t["insert_rate"] == 30.0 and t["sample_rate"] == 50.0
    assert t["blocked_insert_share"] == 0.5 and t["blocked_sample_share"] == 0.0
    assert f["bytes_received_rate"] == 2048.0
    assert monitor.figures(after)["tables"][0]["insert_rate"] is None  # one snapshot: no rate
    restarted = snapshot(time_=103.0, tables=bare(5, 5, 0.0))
    assert monitor.figures(restarted, after)["tables"][0]["insert_rate"] is None  # counters went back
    assert "30.0" in rich_text(monitor.render_rich(after, before))


def test_client_rates_follow_the_client_by_id():
    first = snapshot(time_=10.0, clients=[{"id": 7, "kind": "remote", "peer": "h:1", "connected_seconds": 1.0,
                                           "inserts": {"a": 10, "b": 10}, "samples": {}}])
    second = snapshot(time_=11.0, clients=[{"id": 7, "kind": "remote", "peer": "h:1", "connected_seconds": 2.0,
                                            "inserts": {"a": 15, "b": 20}, "samples": {"a": 4}}],)
    c = monitor.figures(second, first)["clients"][0]
    assert (c["total_inserts"], c["insert_rate"], c["sample_rate"]) == (35, 15.0, 4.0)


def test_control_characters_in_names_are_escaped():
    evil = "t\x1b[31mred\nline"
    out = monitor.render_text(snapshot(tables=[table_entry(evil)], clients=[]))
    assert "\x1b" not in out and "table t\\x1b[31mred\\nline" in out
    assert "t\\x1b[31mred\\nline" in rich_text(monitor.render_rich(snapshot(tables=[table_entry(evil)])))


def test_sparkline_merges_buckets_to_fit_and_scales_to_the_largest():
    assert monitor.sparkline([]) == ""
    assert monitor.sparkline([1, 0, 8]) == "▁ █"
    line = monitor.sparkline(list(range(1, 129)), width=16)
    assert len(line) == 16 and line[-1] == "█" and line == "".join(sorted(line))


def test_json_is_strict_json_with_unbounded_limits_as_null():
    out = monitor.render_json(snapshot())
    parsed = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert parsed["tables"][0]["rate_limiter"]["min_diff"] is None
    assert [t["name"] for t in parsed["tables"]] == ["replay", MARKUP, HTML]


# --- the commands ------------------------------------------------------------------------------


def cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "reprise.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@contextlib.contextmanager
def served(token=None, names=("replay", HTML)):
    """Tables with a few items, inserted and sampled, served locally and on loopback."""
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=1024, block_steps=8)
    tables = [rp.Table(n, store, max_size=100, sampler=rp.selectors.Prioritized(0.6)) for n in names]
    for i, t in enumerate(tables):
        t.insert({"x": np.arange(5 + i, dtype=np.int64).reshape(-1, 1)}, np.linspace(0.5, 4.0, 5 + i))
        t.sample(3)
    server = rp.Server(tables, name=f"monitor-{uuid.uuid4().hex[:8]}", address="127.0.0.1:0", token=token)
    try:
        yield server
    finally:
        server.stop()
        store.close()


def test_unreachable_address_and_unknown_local_name_exit_2_with_one_line():
    r = cli("info", "127.0.0.1:1", "--connect-timeout", "3")
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "cannot reach 127.0.0.1:1" in r.stderr and "check that the server is running" in r.stderr
    r = cli("top", "no-such-server")
    assert r.returncode == 2 and "no local server named 'no-such-server'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_wrong_token_exits_2_naming_the_token_options():
    with served(token="right-token") as server:
        env = dict(os.environ, REPRISE_TOKEN="wrong-token")
        for args in (("info", server.address), ("info", server.address, "--token", "also-wrong"),
                     ("top", server.address)):
            r = cli(*args, env=env)
            assert r.returncode == 2, (args, r.stdout, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
            assert f"{server.address} refused the token" in r.stderr and "REPRISE_TOKEN" in r.stderr


def test_token_with_a_local_address_is_refused():
    r = cli("info", "unix:///nonexistent/x.sock", "--token", "t")
    assert r.returncode == 2 and "--token and --tls* are for remote" in r.stderr


@needs_snapshot
def test_info_json_against_a_served_table_matches_client_info():
    with served(token="tok") as server:
        env = dict(os.environ, REPRISE_TOKEN="tok")
        r = cli("info", server.address, "--json", env=env)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        with rp.Client(server.address, token="tok") as c:
            info = c.info()
    assert [t["name"] for t in got["tables"]] == list(info)
    for t in got["tables"]:
        want = monitor.finite(info[t["name"]])
        assert {k: t[k] for k in want} == want
        assert t["stats"]["priority_histogram"]["total"] == info[t["name"]]["size"]


@needs_snapshot
def test_info_text_names_every_table_by_address_and_by_local_name():
    with served() as server:
        for address in (server.address, server.name, server.local_address):
            r = cli("info", address)
            assert r.returncode == 0, (address, r.stderr)
            lines = r.stdout.splitlines()
            assert "table replay" in lines and f"table {HTML}" in lines, r.stdout


# --- top in a terminal -------------------------------------------------------------------------


@contextlib.contextmanager
def tmux_session(tmp_path, command, width=160, height=40):
    """``command`` running in a detached tmux session of its own (its own server and socket,
    so nothing of the user's tmux is touched); the server is killed and its socket removed at
    the end."""
    socket = tmp_path / "tmux.sock"
    base = [TMUX, "-S", str(socket)]
    subprocess.run(base + ["-f", "/dev/null", "new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height),
                           command], check=True, timeout=10, env=dict(os.environ, TERM="xterm-256color"))
    try:
        yield base
    finally:
        subprocess.run(base + ["kill-server"], capture_output=True, timeout=10)
        socket.unlink(missing_ok=True)


def capture(base) -> str:
    r = subprocess.run(base + ["capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=10)
    return r.stdout if r.returncode == 0 else ""


def alive(base) -> bool:
    r = subprocess.run(base + ["list-panes", "-t", "top", "-F", "#{pane_dead}"], capture_output=True, text=True,
                       timeout=10)
    return r.returncode == 0 and r.stdout.strip() == "0"


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def run_top(tmp_path, base_command, names, quit_keys, pid_file=None):
    """Starts ``base_command`` under tmux, waits until every name is on screen, sends
    ``quit_keys`` (``["SIGTERM"]``: the signal, to the pid in ``pid_file``) and checks that it ended within a few seconds with status 0, left the
    alternate screen and gave the terminal back its line editing and echo."""
    status, modes = tmp_path / "status", tmp_path / "stty"
    command = f"{base_command}; echo $? > {status}; stty -a > {modes}; sleep 30"
    with tmux_session(tmp_path, command) as base:
        screen = wait_for(lambda: (s := capture(base)) and all(n in s for n in names) and s, 30)
        assert screen, f"top never showed {names}; screen:\n{capture(base)}"
        assert "q quits" in screen
        if quit_keys == ["SIGTERM"]:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        else:
            subprocess.run(base + ["send-keys", "-t", "top", *quit_keys], check=True, timeout=10)
        assert wait_for(status.exists, 5), f"top still running 5 s after {quit_keys}:\n{capture(base)}"
        assert wait_for(lambda: status.read_text().strip(), 2) == "0"
        assert "q quits" not in capture(base)  # the alternate screen is gone: the shell's screen is back
        terminal = wait_for(lambda: modes.exists() and modes.read_text().split(), 5)
        assert terminal and "icanon" in terminal and "echo" in terminal, terminal  # cbreak undone
    return screen


FAKE_TOP = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {tests!r})
    with open({pid_file!r}, "w") as f:
        f.write(str(os.getpid()))
    from reprise import monitor
    import test_monitor as T
    state = {{"t": 1000.0}}
    class Fake:
        address = "127.0.0.1:9"
        def close(self): pass
    def fetch(client):
        state["t"] += 1.0
        return T.snapshot(time_=state["t"])
    monitor.connect = lambda *a, **k: Fake()
    monitor.fetch = fetch
    sys.exit(monitor.top_main(["127.0.0.1:9", "--interval", "0.2"]))
""")


@needs_tmux
@pytest.mark.parametrize("quit_keys", [["q"], ["C-c"], ["SIGTERM"]], ids=["q", "ctrl-c", "sigterm"])
def test_top_draws_a_snapshot_in_a_terminal_and_quits(tmp_path, quit_keys):
    script, pid_file = tmp_path / "fake_top.py", tmp_path / "pid"
    script.write_text(FAKE_TOP.format(tests=os.path.dirname(__file__), pid_file=str(pid_file)))
    screen = run_top(tmp_path, f"{sys.executable} {script}", ["replay", MARKUP, HTML, "pid 1234"], quit_keys,
                     pid_file)
    assert "sampled age" in screen and "priorities" in screen


@needs_tmux
@needs_snapshot
def test_top_against_a_served_table_shows_the_tables_and_quits_on_q(tmp_path):
    with served() as server:
        screen = run_top(tmp_path, f"{sys.executable} -m reprise.cli top {server.address}", ["replay", HTML], ["q"])
    assert "size/max" in screen
