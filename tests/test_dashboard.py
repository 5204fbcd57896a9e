"""The server's monitor and dashboard endpoints (issue 16): snapshots through a
server, local and remote clients with their per-client counts, the HTTP API
(page files, /api/snapshot, /api/events), its token rule, and `reprise serve
--dashboard`. The page's script is run under node on a DOM stub (tests/dashboard_dom.js) to
check that names stay text; the page itself is tested in a browser by test_dashboard_browser.py."""

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import reprise as rp
from test_serving import wait_until

TOKEN = "dashboard-token-0123456789"


@pytest.fixture
def store(make_store):
    return make_store({"obs": rp.Field((3,), "float32")}, capacity=1024, block_steps=16)


def get(address, path, token=None, timeout=10):
    req = urllib.request.Request(f"http://{address}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers, r.read()


def status_of(address, path, token=None):
    try:
        return get(address, path, token)[0]
    except urllib.error.HTTPError as e:
        return e.code


def write(client, table, steps, priority=1.0):
    with client.writer() as w:
        for i in range(steps):
            w.append({"obs": np.full(3, i, np.float32)})
            w.create_item(table, 1, priority)


def test_snapshot_counts_each_client_and_drops_it_when_it_leaves(store):
    """Each connection is a client: a local client's writers have connections of
    their own (they are the actors); a remote client's writers share its channel."""
    t = rp.Table("replay", store, max_size=100)
    server = rp.Server([t], address="127.0.0.1:0")
    try:
        local, remote = rp.Client(server.local_address), rp.Client(server.address)
        local_writer, remote_writer = local.writer(), remote.writer()
        for w, steps in ((local_writer, 5), (remote_writer, 3)):
            for i in range(steps):
                w.append({"obs": np.full(3, i, np.float32)})
                w.create_item("replay", 1, 1.0)
            w.flush()
        remote.sample("replay", 4)
        local.sample("replay", 2)
        snap = server.snapshot()
        by_kind = {}
        for c in snap["clients"]:
            by_kind.setdefault(c["kind"], []).append(c)
        assert len(by_kind["local"]) == 2 and len(by_kind["remote"]) == 1, snap["clients"]
        assert all(c["peer"] == f"pid {os.getpid()}" for c in by_kind["local"])
        assert sorted((c["inserts"]["replay"], c["samples"]["replay"]) for c in by_kind["local"]) == [(0, 2), (5, 0)]
        [r] = by_kind["remote"]
        assert (r["inserts"], r["samples"]) == ({"replay": 3}, {"replay": 4})
        assert r["peer"].startswith("127.0.0.1:") and r["connected_seconds"] >= 0
        assert snap["bytes"] == {"received": 3 * 12, "sent": 4 * 12}
        assert snap["server"] == {"name": server.name, "address": server.address}
        [table] = snap["tables"]
        info = t.info()
        assert {k: table[k] for k in info} == info          # the same numbers as info(), infinities included
        # Rates are read at each call's own time (the first second's rate changes with it);
        # everything else is the same state.
        timeless = lambda s: {k: v for k, v in s.items() if k != "rates"}  # noqa: E731
        assert timeless(table["stats"]) == timeless(t.stats())
        # Clients see the same snapshot; stats() is the per-table part of it.
        assert [x["size"] for x in remote.snapshot()["tables"]] == [x["size"] for x in local.snapshot()["tables"]]
        assert timeless(remote.stats()["replay"]) == timeless(t.stats()) == timeless(local.stats()["replay"])
        local_writer.close()
        local.close()
        assert wait_until(lambda: [c["kind"] for c in server.snapshot()["clients"]] == ["remote"], 10)
        remote_writer.close()
    finally:
        server.stop()


def test_dashboard_serves_the_page_and_the_snapshot(store):
    t = rp.Table("replay", store, max_size=100)
    server = rp.Server([t], dashboard_address="127.0.0.1:0")
    try:
        address = server.dashboard_address
        assert server.dashboard_url == f"http://{address}/"
        status, headers, body = get(address, "/")
        assert status == 200 and headers["Content-Type"].startswith("text/html") and b"app.js" in body
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        for name, kind in [("app.js", "text/javascript"), ("style.css", "text/css"), ("uplot.min.js", "text/javascript")]:
            status, headers, _ = get(address, "/" + name)
            assert status == 200 and headers["Content-Type"].startswith(kind), name
        for path in ["/nope.html", "/../server.py", "/%2e%2e/server.py", "/__init__.py"]:
            assert status_of(address, path) == 404, path
        write(rp.Client(server.local_address), "replay", 7)
        _, headers, body = get(address, "/api/snapshot")
        assert headers["Content-Type"] == "application/json"
        snap = json.loads(body)
        assert snap["tables"][0]["size"] == 7 and snap["tables"][0]["stats"]["rates"]["inserts"][-1] >= 0
    finally:
        server.stop()
    assert status_of_closed(address)


def status_of_closed(address):
    """True when nothing listens at ``address`` any more."""
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def test_events_stream_a_snapshot_a_second(store):
    t = rp.Table("replay", store, max_size=100)
    server = rp.Server([t], dashboard_address="127.0.0.1:0")
    try:
        client = rp.Client(server.local_address)
        req = urllib.request.Request(f"http://{server.dashboard_address}/api/events")
        events = []
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            started = time.monotonic()
            buffer = b""
            while len(events) < 3:
                buffer += r.read1(65536)
                while b"\n\n" in buffer:
                    block, buffer = buffer.split(b"\n\n", 1)
                    lines = block.decode().splitlines()
                    if "event: snapshot" in lines:
                        data = "".join(l[len("data: "):] for l in lines if l.startswith("data: "))
                        events.append(json.loads(data))
                        write(client, "replay", 2)
            elapsed = time.monotonic() - started
        sizes = [e["tables"][0]["size"] for e in events]
        assert sizes == sorted(sizes) and sizes[-1] > sizes[0], sizes
        assert 1.0 < elapsed < 8.0, elapsed      # the first at once, then about one a second
    finally:
        server.stop()


def test_data_needs_the_token_and_the_page_does_not(store):
    t = rp.Table("replay", store, max_size=100)
    server = rp.Server([t], address="127.0.0.1:0", token=TOKEN, dashboard_address="127.0.0.1:0")
    try:
        address = server.dashboard_address
        assert status_of(address, "/") == 200
        for path in ["/api/snapshot", "/api/events"]:
            assert status_of(address, path) == 401
            assert status_of(address, path, token="wrong") == 401
        try:
            get(address, "/api/snapshot", token="wrong")
        except urllib.error.HTTPError as e:
            assert e.headers["Content-Type"] == "application/json"
            assert "token" in json.loads(e.read())["error"]
        assert json.loads(get(address, "/api/snapshot", token=TOKEN)[2])["tables"][0]["name"] == "replay"
    finally:
        server.stop()


def test_off_loopback_needs_a_token_and_nothing_is_left_running(store):
    t = rp.Table("replay", store, max_size=100)
    with pytest.raises(rp.errors.InvalidArgument, match="dashboard_address .* is not loopback: a token is required"):
        rp.Server([t], dashboard_address="0.0.0.0:0", name="dash-refused")
    # The refused server released its name: the same name starts now.
    rp.Server([t], name="dash-refused").stop()
    with pytest.raises(rp.errors.InvalidArgument, match="dashboard_address must be 'host:port'"):
        rp.Server([t], dashboard_address=8080)


APP_JS = Path(rp.__file__).parent / "dashboard" / "app.js"
NODE = shutil.which("node")
# Assignments that parse HTML: user-chosen text (table and server names, client peers) must
# reach the page through textContent, title or dataset only.
HTML_SINKS = re.compile(r"\.(?:inner|outer)HTML\s*\+?=|insertAdjacentHTML\s*\(|document\.write(?:ln)?\s*\("
                        r"|createContextualFragment|DOMParser|\.srcdoc\s*=|setAttribute\(\s*['\"]on")
MARKUP = "<img src=x onerror=alert(1)>"


def render(snapshot: dict, tmp_path) -> dict:
    """The page's script run under node on a DOM stub (tests/dashboard_dom.js), given
    ``snapshot`` as the server's answer: what it drew, and any HTML sink it used."""
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(snapshot))
    r = subprocess.run([NODE, str(Path(__file__).with_name("dashboard_dom.js")), str(APP_JS), str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_the_page_script_parses_no_html():
    """app.js builds every element with createElement and sets text with textContent, so a
    name with markup stays text; none of the calls that parse HTML appears in it."""
    code = "\n".join("" if line.lstrip().startswith("//") else line for line in APP_JS.read_text().splitlines())
    found = [f"app.js:{code[:m.start()].count(chr(10)) + 1}: {m.group(0)}" for m in HTML_SINKS.finditer(code)]
    assert not found, f"app.js parses HTML (use textContent / element()): {found}"


def test_names_travel_as_data(store, tmp_path):
    """A table name with markup is JSON text in the snapshot, and the page shows it as
    text: in its row, the detail heading, a client's per-table title and the dataset,
    never through an HTML sink."""
    name = MARKUP
    t = rp.Table(name, store, max_size=10)
    server = rp.Server([t], address="127.0.0.1:0", dashboard_address="127.0.0.1:0")
    try:
        with rp.Client(server.address) as client:
            write(client, name, 3)
            snap = json.loads(get(server.dashboard_address, "/api/snapshot")[2])
        assert snap["tables"][0]["name"] == name
    finally:
        server.stop()
    if NODE is None:
        pytest.skip("needs node (apt-get install nodejs) to run the page's script without a browser; "
                    "test_the_page_script_parses_no_html still checks it")
    page = render(snap, tmp_path)
    assert page["sinks"] == [], page["sinks"]
    assert all(re.fullmatch(r"[a-z]+", tag) for tag in page["created"]), page["created"]
    (row,) = page["tables"]
    assert row["dataset"]["table"] == name and row["cells"]["name"] == name and row["cells"]["size"] == "3"
    assert page["ids"]["detail-name"]["text"] == name and page["ids"]["detail"]["dataset"]["table"] == name
    assert any(c["cells"]["inserts"]["title"] == f"{name}: 3" for c in page["clients"]), page["clients"]


def serve_config(tmp_path, extensions):
    """A `reprise serve` config of one table with the given `extensions` line (TOML)."""
    config = tmp_path / "reprise.toml"
    config.write_text(textwrap.dedent("""
        address = "127.0.0.1:0"
        [[stores]]
        name = "s"
        capacity = 256
        fields = { x = { dtype = "float32" } }
        [[tables]]
        name = "replay"
        store = "s"
    """) + f"extensions = {extensions}\n")
    return config


def serve_with_dashboard(config, token=None):
    """`reprise serve --config CONFIG --dashboard 127.0.0.1:0`, its token from REPRISE_TOKEN
    (unset when None): the process and the dashboard link its first line prints."""
    env = {k: v for k, v in os.environ.items() if k != "REPRISE_TOKEN"}
    if token is not None:
        env["REPRISE_TOKEN"] = token
    proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "serve", "--config", str(config),
                             "--dashboard", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    m = re.search(r"dashboard at (\S+?)\)", line)
    if m is None:
        proc.kill()
        pytest.fail(f"no dashboard link in {line!r}: {proc.communicate(timeout=30)[1]}")
    return proc, m.group(1)


def test_serve_dashboard_flag(tmp_path):
    config = serve_config(tmp_path, '["PriorityHistogram", { kind = "UniqueSamples", window = 50 }]')
    proc, link = serve_with_dashboard(config)
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", link), link   # no token: no fragment
        url = link.split("/")[2]
        snap = json.loads(get(url, "/api/snapshot")[2])
        assert set(snap["tables"][0]["stats"]) == {"priority_histogram", "unique_samples"}
        assert snap["tables"][0]["stats"]["unique_samples"]["window"] == 50
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_serve_prints_the_dashboard_link_with_the_token(tmp_path):
    """With a token, the printed link carries it in the fragment (percent-encoded, read back as
    the page's URLSearchParams does), so the page opens without asking for it."""
    token = TOKEN + "+/ &="
    proc, link = serve_with_dashboard(serve_config(tmp_path, '["Rates"]'), token=token)
    try:
        parts = urllib.parse.urlsplit(link)
        assert (parts.scheme, parts.path, parts.query) == ("http", "/", ""), link
        assert urllib.parse.parse_qs(parts.fragment) == {"token": [token]}, link
        assert status_of(parts.netloc, "/api/snapshot") == 401
        assert status_of(parts.netloc, "/api/snapshot", token=token) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0


def test_dashboard_link_carries_the_token_and_dashboard_url_never_does(store):
    t = rp.Table("replay", store, max_size=10)
    for token, address in ((TOKEN + "+/", "127.0.0.1:0"), (None, "127.0.0.1:0"), (TOKEN, None)):
        server = rp.Server([t], address=address, token=token, dashboard_address="127.0.0.1:0")
        try:
            url = f"http://{server.dashboard_address}/"
            assert server.dashboard_url == url
            fragment = "" if token is None else "#token=" + urllib.parse.quote(token, safe="")
            assert server.dashboard_link == url + fragment
        finally:
            server.stop()
    server = rp.Server([t], address="127.0.0.1:0", token=TOKEN)
    try:
        assert server.dashboard_url is None and server.dashboard_link is None
    finally:
        server.stop()


def test_rate_chart_starts_when_the_server_started(store, tmp_path):
    """The `rates` extension reports its whole window, zeros before the server started: the
    page charts from the second before the server's start (the extension's clock may be a
    second off the page's), not a minute of zeros; a server up longer than the window fills it."""
    if NODE is None:
        pytest.skip("needs node (apt-get install nodejs) to run the page's script without a browser")
    t = rp.Table("replay", store, max_size=100)
    server = rp.Server([t], dashboard_address="127.0.0.1:0")
    try:
        write(rp.Client(server.local_address), "replay", 5)
        time.sleep(1.5)   # the inserts' second is complete: the page charts only complete seconds
        snap = json.loads(get(server.dashboard_address, "/api/snapshot")[2])
    finally:
        server.stop()
    window = len(snap["tables"][0]["stats"]["rates"]["inserts"]) - 1   # the current second is left out
    assert snap["uptime_seconds"] < window / 2, snap["uptime_seconds"]
    last = math.floor(snap["time"]) - 1
    for uptime, first in ((snap["uptime_seconds"], math.floor(snap["time"] - snap["uptime_seconds"]) - 1),
                          (10 * window, last - window + 1)):
        chart = render({**snap, "uptime_seconds": uptime}, tmp_path)["ids"]["rate-chart"]["dataset"]
        assert (int(chart["firstTime"]), int(chart["lastTime"])) == (first, last), (uptime, chart)
        assert int(chart["points"]) == last - first + 1 and int(chart["inserts"]) == 5, chart


def test_serve_refuses_a_misspelled_extension(tmp_path):
    config = serve_config(tmp_path, '[{ kind = "UniqueSample", window = 50 }]')
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", str(config)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "tables[0] ('replay').extensions[0]: unknown kind 'UniqueSample'; did you mean 'UniqueSamples'?" in r.stderr


def test_a_dashboard_without_the_remote_service_takes_a_token(store):
    t = rp.Table("replay", store, max_size=10)
    server = rp.Server([t], token=TOKEN, dashboard_address="127.0.0.1:0")
    try:
        assert server.address is None
        assert status_of(server.dashboard_address, "/api/snapshot") == 401
        assert status_of(server.dashboard_address, "/api/snapshot", token=TOKEN) == 200
    finally:
        server.stop()
    with pytest.raises(rp.errors.InvalidArgument, match="pass address='host:port' too"):
        rp.Server([t], token=TOKEN)
