"""`reprise serve --config`: every key at every level is checked. A misspelled key, an unknown
kind or a value of the wrong type stops the server with exit code 2 and a message that names
the key, its section and the closest valid key; nothing is started and no store is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import reprise as rp
from reprise import server_config

GOOD = """
address = "127.0.0.1:0"

[[stores]]
name = "main"
capacity = 256
block_steps = 16
fields = { obs = { shape = [3], dtype = "float32" }, action = { dtype = "int64" } }

[[tables]]
name = "replay"
store = "main"
sampler = { kind = "Prioritized", priority_exponent = 0.6 }
remover = "Fifo"
max_size = 100
rate_limiter = { kind = "SampleToInsertRatio", samples_per_insert = 4.0, min_size_to_sample = 10, error_buffer = 40.0 }
"""

# (what the user wrote in place of a line of GOOD, what the message must say)
MISTAKES = [
    ("max_size = 100", "max_sise = 100",
     "tables[0] ('replay'): unknown key 'max_sise'; did you mean 'max_size'? [[tables]] keys are name, store,"),
    ('sampler = { kind = "Prioritized", priority_exponent = 0.6 }', 'samplr = "Uniform"',
     "tables[0] ('replay'): unknown key 'samplr'; did you mean 'sampler'?"),
    ("block_steps = 16", "blok_steps = 16",
     "stores[0] ('main'): unknown key 'blok_steps'; did you mean 'block_steps'? [[stores]] keys are"),
    ('fields = { obs = { shape = [3], dtype = "float32" }, action = { dtype = "int64" } }',
     'fields = { obs = { shap = [3], dtype = "float32" }, action = { dtype = "int64" } }',
     "stores[0] ('main').fields.obs: unknown key 'shap'; did you mean 'shape'? field keys are shape, dtype"),
    ("error_buffer = 40.0", "eror_buffer = 40.0",
     "tables[0] ('replay').rate_limiter: unknown key 'eror_buffer'; did you mean 'error_buffer'? SampleToInsertRatio keys are "
     "samples_per_insert, min_size_to_sample, error_buffer"),
    ("samples_per_insert = 4.0, ", "",
     "tables[0] ('replay').rate_limiter: SampleToInsertRatio needs 'samples_per_insert'"),
    ("priority_exponent = 0.6", "priority_exponant = 0.6",
     "tables[0] ('replay').sampler: unknown key 'priority_exponant'; did you mean 'priority_exponent'?"),
    ('remover = "Fifo"', 'remover = { kind = "Fifo", size = 3 }',
     "tables[0] ('replay').remover: unknown key 'size'; Fifo takes no keys"),
    ('remover = "Fifo"', 'remover = "Fifi"', "tables[0] ('replay').remover: unknown kind 'Fifi'; did you mean 'Fifo'?"),
    ("max_size = 100", 'max_size = "100"', "tables[0] ('replay').max_size: expected integer, got a string ('100')"),
    ("max_size = 100", "max_size = true", "tables[0] ('replay').max_size: expected integer, got a boolean (True)"),
    ("min_size_to_sample = 10", "min_size_to_sample = 10.5",
     "tables[0] ('replay').rate_limiter.min_size_to_sample: expected integer, got a number (10.5)"),
    ("capacity = 256", 'capacity = "big"', "stores[0] ('main').capacity: expected integer, got a string ('big')"),
    ('address = "127.0.0.1:0"', 'address = "127.0.0.1:0"\nadress = "x"',
     "top level: unknown key 'adress'; did you mean 'address'? top-level keys are address, token,"),
    ('address = "127.0.0.1:0"', 'address = "127.0.0.1:0"\ncheckpoint_on_exit = "yes"',
     "top level.checkpoint_on_exit: expected boolean, got a string ('yes')"),
    ('address = "127.0.0.1:0"', 'address = "127.0.0.1:0"\n[tls]\ncertificate = "a.pem"',
     "tls: unknown key 'certificate'; [tls] keys are cert, key"),
    ('store = "main"', 'store = "mian"',
     "tables[0] ('replay').store: 'mian' is not one of the [[stores]] ['main']; did you mean 'main'?"),
    # Values of the right kind that the store, a field or the table refuses: named the same way.
    ('action = { dtype = "int64" }', 'action = { dtype = "i64" }',
     "stores[0] ('main').fields.action: unknown dtype 'i64': expected one of bool, int8,"),
    ('obs = { shape = [3], dtype = "float32" }', 'obs = { shape = [3, 0], dtype = "float32" }',
     "stores[0] ('main').fields.obs: Field shape (3, 0): every dimension must be an int >= 1"),
    ("block_steps = 16", "block_steps = 0", "stores[0] ('main'): block_steps must be >= 1, got 0"),
    ("max_size = 100", "max_size = 0", "tables[0] ('replay'): table 'replay': max_size must be >= 1, got 0"),
    ('name = "main"', 'name = "main"\nfields = { x = {} }\ncapacity = 8\n[[stores]]\nname = "main"',
     "stores[1] ('main'): a store named 'main' is already configured; expected every [[stores]] name once"),
]


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "reprise.toml"
    path.write_text(text)
    return str(path)


def test_the_good_config_builds_its_stores_and_tables(tmp_path):
    config = server_config.load_config(_write(tmp_path, GOOD))
    stores, tables = server_config.build(config)
    try:
        assert [t.name for t in tables] == ["replay"]
        assert tables[0].info()["max_size"] == 100
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("old,new,message", MISTAKES, ids=[m[1][:30] or m[0][:30] for m in MISTAKES])
def test_a_mistake_at_any_level_names_the_key_its_section_and_the_closest_valid_key(tmp_path, old, new, message):
    assert old in GOOD
    path = _write(tmp_path, GOOD.replace(old, new, 1))
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(rp.errors.InvalidArgument) as e:
        server_config.build(server_config.load_config(path), path=path)
    assert str(e.value).startswith(f"config {path!r}: {message}"), str(e.value)
    assert set(os.listdir("/dev/shm")) <= before          # no store was left behind


def test_reprise_serve_exits_2_with_the_message_and_no_traceback(tmp_path):
    path = _write(tmp_path, GOOD.replace("max_size = 100", "max_sise = 100"))
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "unknown key 'max_sise'; did you mean 'max_size'?" in r.stderr
    assert "Traceback" not in r.stderr


def test_reprise_serve_names_the_file_store_and_field_of_an_unknown_dtype(tmp_path):
    path = _write(tmp_path, GOOD.replace('dtype = "float32"', 'dtype = "f32"'))
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", "reprise.toml"],
                       capture_output=True, text=True, timeout=60, cwd=os.path.dirname(path))
    assert r.returncode == 2, r.stderr
    assert ("reprise serve: config 'reprise.toml': stores[0] ('main').fields.obs: unknown dtype 'f32': "
            "expected one of bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, float32, "
            "float64\n") in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_config_not_read_from_a_file_names_the_place_alone():
    config = {"stores": [{"name": "s", "capacity": 8, "fields": {"x": {"dtype": "f32"}}}],
              "tables": [{"name": "t", "store": "s"}]}
    with pytest.raises(rp.errors.InvalidArgument) as e:
        server_config.build(config)
    assert str(e.value).startswith("stores[0] ('s').fields.x: unknown dtype 'f32': expected one of bool,")


def test_a_store_directory_is_taken_relative_to_the_config(tmp_path):
    (tmp_path / "shm").mkdir()
    text = GOOD.replace("block_steps = 16", 'block_steps = 16\ndirectory = "shm"')
    stores, _ = server_config.build(server_config.load_config(_write(tmp_path, text)), str(tmp_path))
    try:
        assert os.listdir(tmp_path / "shm"), "the store's file is in the configured directory"
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize("line, message", [
    ("idle_timeout_seconds = 0.5", "top level.idle_timeout_seconds: expected 0 (off) or seconds >= 1, got 0.5"),
    ("stall_timeout_seconds = -1", "top level.stall_timeout_seconds: expected 0 (off) or seconds >= 1, got -1"),
    ("max_connections_per_peer = 0", "max_connections_per_peer"),
    ("keepalive_seconds = \"30\"", "top level.keepalive_seconds: expected number, got a string ('30')"),
])
def test_bad_limits_stop_reprise_serve_with_the_key(tmp_path, line, message):
    path = _write(tmp_path, GOOD.replace('address = "127.0.0.1:0"', f'address = "127.0.0.1:0"\n{line}', 1))
    r = subprocess.run([sys.executable, "-m", "reprise.cli", "serve", "--config", path],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_limits_of_0_are_off_and_others_reach_the_server(tmp_path):
    config = server_config.load_config(_write(tmp_path, GOOD.replace(
        'address = "127.0.0.1:0"', 'address = "127.0.0.1:0"\nidle_timeout_seconds = 0\nstall_timeout_seconds = 5\n'
        'max_connections = 3', 1)))
    assert server_config._limits(config) == {"max_connections": 3, "idle_timeout": None, "stall_timeout": 5}


@pytest.mark.parametrize("spec, field, bad, message", [
    ({"compress": "zstd", "level": 5}, rp.Field((8, 8), "uint8", compress="zstd", level=5), ("level", 40),
     "Field level=40: expected a zstd level from 1 to 19"),
    ({"stack": 4, "padding": "zero"}, rp.Field((8, 8), "uint8", stack=4, padding="zero"), ("stack", 0),
     "Field stack=0: expected"),
])
def test_a_field_may_be_stored_compressed_or_stacked_and_a_bad_setting_names_the_field(spec, field, bad, message):
    config = {"stores": [{"name": "s", "capacity": 64, "block_steps": 16,
                          "fields": {"x": {"shape": [8, 8], "dtype": "uint8", **spec}}}],
              "tables": [{"name": "t", "store": "s"}]}
    stores, _ = server_config.build(config)
    try:
        (store,) = stores.values() if isinstance(stores, dict) else stores
        assert store.signature["x"] == field
    finally:
        for s in (stores.values() if isinstance(stores, dict) else stores):
            s.close()
    config["stores"][0]["fields"]["x"][bad[0]] = bad[1]
    with pytest.raises(rp.errors.InvalidArgument) as e:
        server_config.build(config)
    assert str(e.value).startswith(f"stores[0] ('s').fields.x: {message}")
