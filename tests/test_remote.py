"""The remote service: a real `reprise serve` process on loopback, and remote clients."""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import reprise as rp

CONFIG = """
address = "127.0.0.1:0"
{extra}

[[stores]]
name = "main"
capacity = 4096
block_steps = 16
fields = {{ obs = {{ shape = [3], dtype = "float32" }}, action = {{ dtype = "int64" }} }}

[[tables]]
name = "replay"
store = "main"
sampler = {{ kind = "Prioritized", priority_exponent = 0.8 }}
remover = "Fifo"
max_size = 1000
seed = 7

[[tables]]
name = "queue"
store = "main"
sampler = "Fifo"
remover = "Fifo"
max_size = 100
max_times_sampled = 1
rate_limiter = {{ kind = "Queue", size = 100 }}
evict_when_store_full = false
"""


class Served:
    def __init__(self, tmp_path, extra="", name="reprise.toml"):
        self.config = tmp_path / name
        self.config.write_text(CONFIG.format(extra=extra))
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "serve", "--config", str(self.config)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if " at " not in line:
            self.close()
            raise AssertionError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.banner = line
        self.address = line.split(" at ")[1].split(" ")[0]

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=60)
        return self.proc.returncode, out, err

    def close(self):
        """Stops the server as an operator would (SIGTERM), so it removes its socket, lock
        file and store files; SIGKILL only if it hangs."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    yield s
    s.close()


def write_episodes(client_or_store, table="replay", episodes=3, length=7, flush=True):
    """Episodes of `length` steps, an item over the last 2 steps at each step >= 1."""
    w = client_or_store.writer(table) if isinstance(client_or_store, rp.Client) else client_or_store.writer()
    with w:
        for e in range(episodes):
            for t in range(length):
                w.append({"obs": np.full(3, e * 100 + t, np.float32), "action": t})
                if t >= 1:
                    w.create_item(table, 2, 1.0 + t)
            w.end_episode()
        if flush:
            w.flush()


def test_round_trip_identical_to_local(served):
    client = rp.Client(served.address)
    assert client.tables == ["replay", "queue"]
    write_episodes(client)
    # The same operations on an in-process table made as the config says.
    store = rp.Store({"obs": rp.Field((3,), "float32"), "action": rp.Field((), "int64")}, capacity=4096, block_steps=16)
    try:
        local = rp.Table("replay", store, sampler=rp.selectors.Prioritized(0.8), remover=rp.selectors.Fifo(),
                         max_size=1000, seed=7)
        write_episodes(store)
        assert client.info()["replay"]["size"] == local.size == 18
        for n in (1, 5, 32):
            r, s = client.sample("replay", n), local.sample(n)
            np.testing.assert_array_equal(r.keys, s.keys)
            np.testing.assert_array_equal(r.probabilities, s.probabilities)
            np.testing.assert_array_equal(r.lengths, s.lengths)
            assert r.table_size == s.table_size
            for f in ("obs", "action"):
                assert r.data[f].dtype == s.data[f].dtype and r.data[f].shape == s.data[f].shape
                np.testing.assert_array_equal(r.data[f], s.data[f])
        keys = local.sample(4).keys
        np.testing.assert_array_equal(client.sample("replay", 4).keys, keys)   # keeps both generators in step
        assert client.update_priorities("replay", keys, [5.0] * 4) == local.update_priorities(keys, [5.0] * 4)
        assert client.delete("replay", keys[:2]) == local.delete(keys[:2]) == 2
        assert client.delete("replay", keys[:2]) == 0   # already gone: skipped
        r, s = client.sample("replay", 8, fields=["action"]), local.sample(8, fields=["action"])
        assert list(r.data) == ["action"]
        np.testing.assert_array_equal(r.data["action"], s.data["action"])
        ri, li = client.info()["replay"], local.info()
        for k in ("size", "num_inserts", "num_samples", "num_deletes", "sampler", "remover"):
            assert ri[k] == li[k], k
        client.reset("replay")
        assert client.info()["replay"]["size"] == 0
    finally:
        store.close()


def test_bad_input_over_the_wire_is_refused_and_changes_nothing(served):
    client = rp.Client(served.address)
    write_episodes(client, episodes=1)
    before = client.info()["replay"]
    with pytest.raises(rp.errors.NotFound, match="no table named 'nope'"):
        client.sample("nope", 1)
    with pytest.raises(rp.errors.NotFound, match="unknown field 'zzz'"):
        client.sample("replay", 1, fields=["zzz"])
    keys = client.sample("replay", 2).keys
    with pytest.raises(rp.errors.InvalidArgument, match="NaN"):
        client.update_priorities("replay", keys, [1.0, float("nan")])
    with pytest.raises(rp.errors.InvalidArgument, match="sample size must be >= 1"):
        client.sample("replay", 0)
    with client.writer() as w:
        with pytest.raises(rp.errors.InvalidArgument, match=r"expects float32\[3\], got float64"):
            w.append({"obs": np.zeros(3, np.float64), "action": 1})
        w.append({"obs": np.zeros(3, np.float32), "action": 1})
        w.create_item("replay", 5, 1.0)     # longer than the episode: refused when applied
        with pytest.raises(rp.errors.InvalidArgument, match="longer than the episode"):
            w.flush()
    after = client.info()["replay"]
    assert after["size"] == before["size"] and after["num_inserts"] == before["num_inserts"]
    # The server is still up for everyone.
    assert rp.Client(served.address).info()["replay"]["size"] == before["size"]


def test_timeout_carries_the_partial_sample(served):
    client = rp.Client(served.address)
    with client.writer("queue") as w:
        for t in range(3):
            w.append({"obs": np.full(3, t, np.float32), "action": t})
            w.create_item("queue", 1, 1.0)
        w.flush()
    with pytest.raises(rp.errors.Timeout) as e:
        client.sample("queue", 5, timeout=0.2)
    assert e.value.partial is not None and e.value.partial.data["action"][:, 0].tolist() == [0, 1, 2]
    with pytest.raises(rp.errors.Timeout) as e:
        client.sample("queue", 1, timeout=0)
    assert e.value.partial is None


TOKEN = "SeCrEt-Token"
# Everything but the exact token: other cases, prefixes, extensions, padding, empty.
WRONG_TOKENS = ["secret-token", "SECRET-TOKEN", "Secret-Token", "SeCrEt-TokeN", "SeCrEt", "SeCrEt-Token2",
                " SeCrEt-Token", "SeCrEt-Token ", ""]


def test_token_is_required_and_checked(tmp_path):
    s = Served(tmp_path, extra=f'token = "{TOKEN}"')
    try:
        with pytest.raises(rp.errors.Unauthenticated, match="needs a token"):
            rp.Client(s.address)
        for wrong in WRONG_TOKENS:
            with pytest.raises(rp.errors.Unauthenticated, match="wrong token"):
                rp.Client(s.address, token=wrong)
        c = rp.Client(s.address, token=TOKEN)
        write_episodes(c, episodes=1)
        assert c.info()["replay"]["size"] == 6
    finally:
        s.close()


def test_non_loopback_address_needs_a_token(tmp_path):
    cfg = tmp_path / "open.toml"
    cfg.write_text(CONFIG.format(extra="").replace('address = "127.0.0.1:0"', 'address = "0.0.0.0:0"'))
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "is not loopback: a token is required" in r.stderr
    store = rp.Store({"x": rp.Field((), "float32")}, capacity=64)
    try:
        t = rp.Table("t", store)
        with pytest.raises(rp.errors.InvalidArgument, match="not loopback"):
            rp.Server([t], address="0.0.0.0:0")
        server = rp.Server([t], address="0.0.0.0:0", token="x")   # with a token it starts
        server.stop()
    finally:
        store.close()


def test_bad_configs_are_refused(tmp_path):
    cases = {
        "nonsense = 1\n" + CONFIG.format(extra=""): "unknown key 'nonsense'",
        CONFIG.format(extra="").replace('store = "main"\nsampler = {', 'store = "other"\nsampler = {'): "tables[0] ('replay').store: 'other' is not one of",
        CONFIG.format(extra="").replace('kind = "Prioritized"', 'kind = "Bogus"'): "unknown kind 'Bogus'",
        "address = [": "not valid TOML",
    }
    for i, (text, message) in enumerate(cases.items()):
        cfg = tmp_path / f"bad{i}.toml"
        cfg.write_text(text)
        r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert message in r.stderr, (message, r.stderr)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_round_trip(tmp_path):
    ca_key, ca, key, csr, cert = (tmp_path / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = tmp_path / "ext.cnf"
    ext.write_text("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n")

    def openssl(*args):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    # A private CA, and a server certificate it signs (rustls refuses a CA certificate as the server's).
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=localhost")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert, "-days", "1",
            "-extfile", ext)
    s = Served(tmp_path, extra=f'token = "t"\n[tls]\ncert = "{cert.name}"\nkey = "{key.name}"')
    try:
        c = rp.Client(s.address, token="t", tls_ca=str(ca), tls_domain="localhost")
        write_episodes(c, episodes=1)
        got = c.sample("replay", 4)
        assert got.data["obs"].shape == (4, 2, 3)
        # Plain text to a TLS server fails cleanly.
        with pytest.raises(rp.errors.RepriseError):
            rp.Client(s.address, token="t", connect_timeout=5)
    finally:
        s.close()


KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import reprise as rp
    c = rp.Client(sys.argv[1])
    w = c.writer("replay")
    for t in range(10):
        w.append({"obs": np.full(3, t, np.float32), "action": t})
        if t >= 1:
            w.create_item("replay", 2, 1.0)
    w.flush()                        # 9 items committed
    for t in range(10, 500):
        w.append({"obs": np.full(3, t, np.float32), "action": t})
        w.create_item("replay", 2, 1.0)
    print("queued", flush=True)      # ~490 steps and items queued in this process, not flushed
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_client_killed_mid_stream_leaves_no_partial_item(served, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER)
    r = subprocess.run([sys.executable, str(script), served.address], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL and "queued" in r.stdout
    client = rp.Client(served.address)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and client.info()["replay"]["size"] < 9:
        time.sleep(0.05)
    size = client.info()["replay"]["size"]
    assert size >= 9
    # Whatever arrived is whole: every item's two steps are consecutive steps of the writer.
    s = client.sample("replay", 64)
    actions = s.data["action"]
    assert (s.lengths == 2).all()
    assert (actions[:, 1] == actions[:, 0] + 1).all()
    np.testing.assert_array_equal(s.data["obs"][:, :, 0], actions.astype(np.float32))
    # The server is fine and its blocks came back.
    write_episodes(client, episodes=1)


def test_restart_with_checkpoint_dir(tmp_path):
    extra = 'checkpoint_dir = "ckpt"\ncheckpoint_on_exit = true'
    s = Served(tmp_path, extra=extra)
    try:
        c = rp.Client(s.address)
        write_episodes(c)
        first = c.sample("replay", 6)   # advances the sampler's generator and times_sampled
        before = c.info()["replay"]
        code, out, err = s.stop()
        assert code == 0, err
        assert "reprise serve: checkpoint" in out
        s.start()
        assert "restored" in s.banner
        c = rp.Client(s.address)
        after = c.info()["replay"]
        for k in ("size", "num_inserts", "num_samples"):
            assert after[k] == before[k], k
        again = c.sample("replay", 64)
        assert again.data["obs"].shape[1:] == first.data["obs"].shape[1:]
        a = again.data["action"]
        assert (a[:, 1] == a[:, 0] + 1).all()   # each restored item is its own two steps
        np.testing.assert_array_equal(again.data["obs"][:, :, 0] % 100, a.astype(np.float32))
    finally:
        s.close()


def test_sigterm_finishes_inserts_in_flight_and_checkpoints_them(tmp_path):
    """SIGTERM while a writer streams: every item whose flush was acknowledged is in
    the exit checkpoint, whole; the writer gets a clear error, not a hang."""
    import threading
    s = Served(tmp_path, extra='checkpoint_dir = "ckpt"\ncheckpoint_on_exit = true')
    acked, failure, streaming = [0], [], threading.Event()   # acked: items whose flush returned

    def write():
        try:
            with rp.Client(s.address).writer("replay") as w:
                step = made = 0
                while True:
                    for _ in range(50):
                        w.append({"obs": np.full(3, step, np.float32), "action": step})
                        if step % 1000:      # items never span two of the writer's episodes
                            w.create_item("replay", 2, 1.0)
                            made += 1
                        step += 1
                        if step % 1000 == 0:
                            w.end_episode()
                    w.flush(timeout=30)
                    acked[0] = made
                    streaming.set()
        except rp.errors.RepriseError as e:
            failure.append(e)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert streaming.wait(60), "the writer never got a flush acknowledged"
        code, out, err = s.stop()
        writer.join(60)
        assert not writer.is_alive(), "the writer hung after the server stopped"
        assert code == 0, err
        assert len(failure) == 1 and re.search("shutting down|lost|unavailable|connect", str(failure[0]), re.I), failure
        assert "reprise serve: checkpoint" in out
        path = out.split("reprise serve: checkpoint ")[1].split()[0]
        loaded = rp.checkpoint.load(path)
        try:
            t = loaded["replay"]
            assert acked[0] > 0 and len(t) >= min(acked[0], 1000)          # max_size is 1000 (Fifo remover)
            assert t.info()["num_inserts"] >= acked[0]                      # nothing acknowledged was lost
            got = t.sample(len(t), timeout=0)
            a = got.data["action"]
            assert (got.lengths == 2).all() and (a[:, 1] == a[:, 0] + 1).all()   # whole items only
            np.testing.assert_array_equal(got.data["obs"][:, :, 0], a.astype(np.float32))
        finally:
            for st in {id(x.store): x.store for x in loaded.values()}.values():
                st.close()
    finally:
        s.close()


def refused(call):
    """The error type and the start of the message a call is refused with."""
    try:
        call()
    except rp.errors.RepriseError as e:
        return type(e).__name__, str(e)[:40]
    return None


def test_client_api_matches_local_client(tmp_path):
    """Every public method of rp.Client answers the same through the local (shared
    memory) and the remote (gRPC) transport of one server."""
    store = rp.Store({"obs": rp.Field((3,), "float32"), "action": rp.Field((), "int64")}, capacity=1024, block_steps=16)
    try:
        t = rp.Table("replay", store, sampler=rp.selectors.Fifo(), max_size=500)
        with rp.Server([t], address="127.0.0.1:0", checkpoint_dir=tmp_path / "ckpt") as server:
            clients = {"local": rp.Client(server.local_address), "remote": rp.Client(server.address)}
            seen = {}
            for kind, c in clients.items():
                t.reset()
                start = t.info()
                got = seen[kind] = {}
                got["address"] = c.address == (server.local_address if kind == "local" else server.address)
                got["tables"] = c.tables
                got["writer"] = write_episodes(c, episodes=1) or len(t)
                s = c.sample("replay", 3)
                got["sample"] = (s.keys.tolist() == [min(s.keys)] * 3, s.data["action"].tolist())   # Fifo: oldest
                got["iterate"] = [b.data["action"].tolist() for b in c.iterate("replay", 2, max_in_flight=1, num_batches=2)]
                got["update_priorities"] = c.update_priorities("replay", s.keys, [2.0, 3.0, 4.0])
                got["delete"] = c.delete("replay", s.keys[:2])
                got["info"] = {k: c.info()["replay"][k] - start[k] for k in ("size", "num_inserts", "num_samples", "num_deletes")}
                # Rates are read at each call's own time; everything else is the same state.
                timeless = lambda s: {k: v for k, v in s.items() if k != "rates"}  # noqa: E731
                got["stats"] = timeless(c.stats()["replay"]) == timeless(t.stats())
                snap = c.snapshot()
                got["snapshot"] = ([x["name"] for x in snap["tables"]], snap["tables"][0]["size"] == len(t),
                                   kind in {x["kind"] for x in snap["clients"]})
                got["checkpoint"] = os.path.isdir(c.checkpoint())
                got["attributes"] = c.attributes("replay")
                got["set_version"] = refused(lambda: c.set_version("replay", 1))        # no version attribute
                got["update_attributes"] = refused(lambda: c.update_attributes("replay", s.keys, {"reward": 1.0}))
                got["reset"] = c.reset("replay") or len(t)
                got["close"] = c.close()
            public = {m for m in dir(rp.Client) if not m.startswith("_")}
            assert set(seen["local"]) == public, "exercise every public method of rp.Client here"
            for m in public:
                assert seen["remote"][m] == seen["local"][m], m
            assert seen["local"]["info"]["num_deletes"] == 1 and seen["local"]["checkpoint"]
    finally:
        store.close()
    assert "host:port" in rp.Client.__doc__


def _pool_servers(n=2):
    made = []
    for i in range(n):
        store = rp.Store({"obs": rp.Field((3,), "float32"), "action": rp.Field((), "int64")}, capacity=1024, block_steps=16)
        t = rp.Table("replay", store, sampler=rp.selectors.Uniform(), max_size=500, seed=i)
        made.append((store, t, rp.Server([t], address="127.0.0.1:0")))
    return made


def test_pool_spreads_episodes_and_merges_samples(caplog):
    made = _pool_servers(2)
    try:
        pool = rp.ClientPool([s.address for _, _, s in made])
        with pool.writer("replay") as w:
            went = []
            for e in range(4):
                went.append(w.server)
                for t in range(5 + e):
                    w.append({"obs": np.full(3, e, np.float32), "action": t})
                    w.create_item("replay", 1, 1.0)
                w.end_episode()
        assert went == [made[0][2].address, made[1][2].address] * 2
        sizes = [t.size for _, t, _ in made]
        assert sizes == [5 + 7, 6 + 8]
        s = pool.sample("replay", 26)
        assert len(s) == 26 and s.table_size == 26
        assert sorted(np.bincount(s.servers).tolist()) == [12, 14]          # shares follow the sizes
        np.testing.assert_allclose(s.probabilities, 1 / 26)                 # uniform over the union
        np.testing.assert_allclose(s.importance_weights(1.0), 1.0)
        # Keys are per server: updates go where each item came from.
        assert pool.update_priorities("replay", s.keys, 2.0, servers=s.servers) == 26
        with pytest.raises(rp.errors.InvalidArgument, match="servers=sample.servers"):
            pool.update_priorities("replay", s.keys, 2.0, servers=s.servers[:3])
        # A dead server is skipped with a warning; the other keeps serving.
        made[1][2].stop()
        with caplog.at_level("WARNING", logger="reprise"):
            s = pool.sample("replay", 8)
            assert (s.servers == 0).all() and len(s) == 8
            with pool.writer("replay") as w:
                w.append({"obs": np.zeros(3, np.float32), "action": 0})
                w.create_item("replay", 1, 1.0)
                w.end_episode()
        assert any("unreachable" in r.getMessage() for r in caplog.records)
        assert made[0][1].size == 13
    finally:
        for store, _, server in made:
            server.stop()
            store.close()


def test_pool_needs_a_live_server():
    with pytest.raises(rp.errors.InvalidArgument, match="non-empty list"):
        rp.ClientPool([])
    with pytest.raises(rp.errors.RepriseError, match="can be reached"):
        rp.ClientPool(["127.0.0.1:1"])


def _scrape(address, token=None):
    import urllib.request
    req = urllib.request.Request(f"http://{address}/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode()


def _metric(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in:\n{text}")


def test_prometheus_metrics():
    import urllib.error
    store = rp.Store({"obs": rp.Field((3,), "float32"), "action": rp.Field((), "int64")}, capacity=1024, block_steps=16)
    try:
        t = rp.Table("replay", store, max_size=100)
        server = rp.Server([t], address="127.0.0.1:0", metrics_address="127.0.0.1:0")
        c = rp.Client(server.address)
        write_episodes(c, episodes=2)
        c.sample("replay", 4)
        with pytest.raises(rp.errors.NotFound):
            c.sample("replay", 1, fields=["zzz"])     # refused by the server
        text = _scrape(server.metrics_address)
        assert _metric(text, "reprise_table_size", table="replay") == 12
        assert _metric(text, "reprise_table_inserts_total", table="replay") == 12
        assert _metric(text, "reprise_table_samples_total", table="replay") == 4
        assert _metric(text, "reprise_table_blocked_sample_seconds_total", table="replay") == 0
        assert _metric(text, "reprise_requests_total", method="Sample") == 2
        assert _metric(text, "reprise_errors_total", method="Sample", code="NotFound") == 1
        assert _metric(text, "reprise_received_bytes_total", table="replay") == 14 * 20   # 14 steps of 12 + 8 bytes
        assert _metric(text, "reprise_sent_bytes_total", table="replay") == 4 * 2 * 20
        with pytest.raises(urllib.error.HTTPError) as e:
            import urllib.request
            urllib.request.urlopen(f"http://{server.metrics_address}/other", timeout=10)
        assert e.value.code == 404
        server.stop()
        with pytest.raises(rp.errors.InvalidArgument, match="metrics_address .* is not loopback: a token is required"):
            rp.Server([t], address="127.0.0.1:0", metrics_address="0.0.0.0:0")
        server = rp.Server([t], address="127.0.0.1:0", token=TOKEN, metrics_address="0.0.0.0:0")
        port = server.metrics_address.rsplit(":", 1)[1]
        with pytest.raises(urllib.error.HTTPError) as e:
            _scrape(f"127.0.0.1:{port}")
        assert e.value.code == 401
        assert "reprise_table_size" in _scrape(f"127.0.0.1:{port}", token=TOKEN)
        server.stop()
    finally:
        store.close()


def _http_status(address, headers):
    """The status of `GET /metrics` sent with exactly these header lines."""
    import socket
    with socket.create_connection(tuple(address.rsplit(":", 1)), timeout=10) as sock:
        sock.sendall(("GET /metrics HTTP/1.1\r\nHost: x\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode())
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize("metrics_address", ["127.0.0.1:0", "0.0.0.0:0"])
def test_metrics_refuse_every_token_but_the_exact_one(metrics_address):
    """A server with a token checks it on the metrics endpoint too, whatever its address,
    byte for byte (only the scheme word 'Bearer' is case-insensitive, as HTTP says)."""
    store = rp.Store({"x": rp.Field((), "float32")}, capacity=64)
    try:
        server = rp.Server([rp.Table("t", store)], address="127.0.0.1:0", token=TOKEN, metrics_address=metrics_address)
        address = "127.0.0.1:" + server.metrics_address.rsplit(":", 1)[1]
        assert _http_status(address, [f"Authorization: Bearer {TOKEN}"]) == 200
        assert _http_status(address, [f"authorization: bearer {TOKEN}"]) == 200
        assert _http_status(address, [f"AUTHORIZATION:   BEARER {TOKEN}  "]) == 200   # optional whitespace
        for wrong in WRONG_TOKENS:
            if wrong != wrong.rstrip():
                continue    # HTTP drops whitespace at the end of a header value: that is the exact token
            assert _http_status(address, [f"Authorization: Bearer {wrong}"]) == 401, wrong
        for header in [[], ["Authorization:"], [f"Authorization: {TOKEN}"], [f"Authorization: Basic {TOKEN}"],
                       [f"Authorization: Bearer  {TOKEN}"], [f"X-Authorization: Bearer {TOKEN}"]]:
            assert _http_status(address, header) == 401, header
        server.stop()
    finally:
        store.close()


def test_iterate_pipelines_batches_on_one_stream(served):
    client = rp.Client(served.address)
    write_episodes(client, episodes=4)
    batches = list(client.iterate("replay", 16, max_in_flight=3, num_batches=5))
    assert len(batches) == 5 and all(len(b) == 16 for b in batches)
    for b in batches:
        a = b.data["action"]
        assert (a[:, 1] == a[:, 0] + 1).all()
    info = client.info()["replay"]
    assert 5 * 16 <= info["num_samples"] <= 8 * 16    # at most max_in_flight batches drawn ahead
    with pytest.raises(rp.errors.InvalidArgument, match="max_in_flight must be >= 1"):
        next(client.iterate("replay", 4, max_in_flight=0))
    with pytest.raises(rp.errors.NotFound, match="no table named 'nope'"):
        next(client.iterate("nope", 4))
    # The local client has the same method (a plain loop).
    store = rp.Store({"x": rp.Field((), "float32")}, capacity=64)
    try:
        t = rp.Table("t", store)
        t.insert({"x": np.ones((4, 1), np.float32)}, priorities=1.0)
        with rp.Server([t]) as server:
            got = list(rp.Client(server.local_address).iterate("t", 2, num_batches=3))
            assert [len(b) for b in got] == [2, 2, 2]
    finally:
        store.close()


def test_a_client_pointed_at_the_dashboard_or_metrics_port_is_told_so():
    store = rp.Store({"x": rp.Field((), "int64")}, capacity=64, block_steps=8)
    server = rp.Server([rp.Table("t", store)], address="127.0.0.1:0", dashboard_address="127.0.0.1:0",
                       metrics_address="127.0.0.1:0")
    try:
        for wrong in (server.dashboard_address, server.metrics_address):
            with pytest.raises(rp.errors.InvalidArgument, match=rf"{re.escape(wrong)} answers HTTP .*not the replay service.*server\.address"):
                rp.Client(wrong)
        assert rp.Client(server.address).tables == ["t"]
    finally:
        server.stop()
