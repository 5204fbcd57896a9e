"""Every code block of README.md and docs/*.md runs as written.

Fenced blocks labelled ``python``, ``toml`` or ``bash``/``sh``/``shell`` are collected;
unlabelled fences are text (output, signatures, layouts) and are not run. Each block
runs in a fresh subprocess with a timeout, in a temporary directory that also holds
``$TMPDIR`` and ``$XDG_RUNTIME_DIR`` (so servers' sockets land there), and the test
fails if the block leaves a store file in /dev/shm or anything in the runtime
directory. Test ids name the file and line of the fence: ``docs/remote.md:42``.

A snippet fails when it exits non-zero (an exception, ``TypeError: 'int' object is not
callable`` from a property called as a method included) and when a Python snippet's
stderr shows a traceback although it exited 0 (an exception in a thread). A Python
snippet (not under torchrun, with no other language in its chain) runs twice in the same
directories, as a reader who runs it again would: the second run must print what the
first printed, unless the output is not deterministic anyway (a third run, in fresh
directories, prints something else too: ports, pids, unseeded draws). So a snippet that
keeps state outside its run (a checkpoint directory at a fixed path) fails.

Prose is checked too: no ``x.name(`` anywhere in the docs where ``name`` is a property
of Reprise's classes (and a method of none).

A block can be marked by an HTML comment on the line right before its fence,
``<!-- snippet: DIRECTIVE; DIRECTIVE -->``:

``skip (reason)``
    not run; the reason is required and shows in pytest's skip report. For blocks
    that install packages, need several hosts, run a long demo or need files the
    reader supplies.
``continues``
    runs after the previous block of the same file, in the same directory;
    consecutive Python blocks also share one process, so names defined earlier
    stay defined.
``gpu``
    uses Reprise's GPU path: runs on a CUDA device where there is one, else with
    ``reprise.torch.emulate_cuda(True)`` (Reprise's "cuda" mapped to the CPU).
``cuda``
    makes CUDA tensors itself: skipped where no CUDA device is present.
``torchrun N``
    saved as a script and run with ``torchrun --standalone --nproc-per-node N``.

A TOML block is a ``reprise serve`` config: it is written to ``reprise.toml`` and
served with ``reprise serve`` (every address on loopback port 0, so that CI never
collides with a port in use); the test writes ``min_size_to_sample`` one-step items
into each table over gRPC, samples one, and stops the server with SIGTERM, which
must exit 0.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.util
import inspect
import os
import pkgutil
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "toml": "toml", "bash": "bash", "sh": "bash", "shell": "bash"}
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*snippet:(.*?)-->\s*$")
TIMEOUT = 60.0            # seconds per process
TORCHRUN_TIMEOUT = 120.0
CASE_ENV = "REPRISE_DOCS_CASE"   # marks the processes of one test case
# Commands a shell block may call that a fresh machine may lack: the block is then skipped,
# naming them, rather than failed (`reprise`, python and coreutils are always there).
OPTIONAL_TOOLS = {"openssl": "openssl", "curl": "curl", "jq": "jq", "tmux": "tmux", "nft": "nftables",
                  "tc": "iproute2", "ip": "iproute2", "ping": "iputils-ping", "redis-server": "redis-server",
                  "chromium": "chromium", "node": "nodejs"}


@dataclasses.dataclass
class Block:
    doc: str              # "docs/remote.md"
    line: int             # the opening fence's line, 1-based
    language: str         # python, toml or bash
    code: str
    skip: str | None = None
    continues: bool = False
    gpu: bool = False
    cuda: bool = False
    torchrun: int | None = None
    problem: str | None = None    # a bad marker: the block fails instead of running

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def _split(text: str) -> list[str]:
    """Directives separated by ';', where a skip reason may hold ';' and parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == ";" and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (ch == "(") - (ch == ")")
        current += ch
    return [p.strip() for p in parts + [current] if p.strip()]


def _directives(block: Block, text: str, problems: list[str]):
    for part in _split(text):
        if part.startswith("skip"):
            reason = re.fullmatch(r"skip\s*\((.*)\)", part, re.S)
            if reason is None or not reason.group(1).strip():
                block.problem = f"{block.where}: 'skip' needs a reason: <!-- snippet: skip (why) -->"
            else:
                block.skip = reason.group(1).strip()
        elif part == "continues":
            block.continues = True
        elif part == "gpu":
            block.gpu = True
        elif part == "cuda":
            block.cuda = True
        elif re.fullmatch(r"torchrun \d+", part):
            block.torchrun = int(part.split()[1])
        else:
            block.problem = (f"{block.where}: unknown snippet directive {part!r}; expected skip (reason), "
                             "continues, gpu, cuda or torchrun N")
        if block.problem:
            problems.append(block.problem)


def parse(text: str, doc: str) -> tuple[list[Block], list[str]]:
    """The runnable blocks of one markdown file, and what is wrong with its markers."""
    lines = text.split("\n")
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            if lines[i].lstrip().startswith("<!--") and "snippet" in lines[i]:
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                if not MARKER.match(lines[i]) or not FENCE.match(nxt):
                    problems.append(f"{doc}:{i + 1}: a snippet marker must be a whole line right before a fence")
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            problems.append(f"{doc}:{i + 1}: a fence that is never closed")
            break
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        language = LANGUAGES.get(fence.group(1))
        if language is None:
            if marker:
                problems.append(f"{doc}:{i + 1}: a snippet marker on a block that is not run ({fence.group(1)!r})")
        else:
            block = Block(doc, i + 1, language, "\n".join(lines[i + 1:end]))
            if marker:
                _directives(block, marker.group(1), problems)
            blocks.append(block)
        i = end + 1
    return blocks, problems


@dataclasses.dataclass
class Case:
    id: str               # the first block's place, or the cuda block's
    blocks: list[Block]
    skip: str | None = None
    needs_cuda: bool = False


def cases() -> tuple[list[Case], list[str]]:
    """Chains of blocks (a block and the ``continues`` blocks after it), as test cases.
    A chain with a ``cuda`` block gives two cases: the blocks before it (always run),
    and the whole chain (only with CUDA), named for the ``cuda`` block."""
    out, problems = [], []
    for path in DOCS:
        blocks, bad = parse(path.read_text(), path.relative_to(ROOT).as_posix())
        problems += bad
        chains: list[list[Block]] = []
        for b in blocks:
            if b.continues:
                if not chains or chains[-1][-1].skip is not None:
                    problems.append(f"{b.where}: 'continues', but no runnable block comes before it")
                    continue
                if b.skip is not None:
                    problems.append(f"{b.where}: a skipped block cannot continue another")
                chains[-1].append(b)
            else:
                chains.append([b])
        for chain in chains:
            if chain[0].skip is not None:
                out.append(Case(chain[0].where, chain, skip=chain[0].skip))
                continue
            if any(b.torchrun for b in chain) and len(chain) > 1:
                problems.append(f"{chain[0].where}: a torchrun block runs alone (no 'continues' into or after it)")
                continue
            first_cuda = next((k for k, b in enumerate(chain) if b.cuda), None)
            if first_cuda is None:
                out.append(Case(chain[0].where, chain))
                continue
            if first_cuda > 0:
                out.append(Case(chain[0].where, chain[:first_cuda]))
            out.append(Case(chain[first_cuda].where, chain, needs_cuda=True))
    return out, problems


CASES, PROBLEMS = cases()


def test_snippet_markers_are_valid():
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_every_doc_has_its_blocks_collected():
    docs = {c.blocks[0].doc for c in CASES}
    assert "README.md" in docs and "docs/remote.md" in docs and "docs/concepts.md" in docs


@pytest.mark.parametrize("marker, problem", [
    ("<!-- snippet: skip -->", "'skip' needs a reason"),
    ("<!-- snippet: skip ( ) -->", "'skip' needs a reason"),
    ("<!-- snippet: skip because -->", "'skip' needs a reason"),
    ("<!-- snippet: continue -->", "unknown snippet directive 'continue'"),
])
def test_a_bad_marker_is_refused_and_its_block_fails(marker, problem):
    blocks, problems = parse(f"# t\n\n{marker}\n```python\nprint(1)\n```\n", "t.md")
    assert len(problems) == 1 and problem in problems[0] and problems[0].startswith("t.md:4: ")
    assert blocks[0].problem == problems[0] and blocks[0].skip is None


def test_markers_hold_reasons_with_semicolons_and_parentheses():
    text = ("# t\n\n```bash\ntrue\n```\n"
            "<!-- snippet: continues; skip (a reason; with (nested) parts) -->\n```python\n```\n")
    blocks, problems = parse(text, "t.md")
    assert blocks[1].continues and blocks[1].skip == "a reason; with (nested) parts" and not problems


def test_a_marker_away_from_a_fence_is_refused():
    _, problems = parse("# t\n\n<!-- snippet: skip (why) -->\n\n```python\n```\n", "t.md")
    assert problems == ["t.md:3: a snippet marker must be a whole line right before a fence"]


# -- running ------------------------------------------------------------------------------

@functools.cache
def _cuda() -> bool | None:
    """True with a CUDA device, False with torch but none, None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return bool(torch.cuda.is_available())


def _run(argv, where: str, cwd: Path, env: dict, timeout: float, stdin: str | None = None,
         traceback_fails: bool = False) -> str:
    """Runs ``argv`` in a session of its own and fails the test, with its output, on a
    non-zero exit (or, with ``traceback_fails``, on a traceback in its stderr: an
    exception in a thread does not change the exit status); returns its stdout. A
    process still running after ``timeout`` (or still holding the pipes: a child left
    behind) is killed with its whole session."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{where}: still running after {timeout:.0f} s\n{_output(out, err)}", pytrace=False)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        pytest.fail(f"{where}: exit status {proc.returncode}\n{_output(out, err)}", pytrace=False)
    if traceback_fails and "Traceback (most recent call last)" in err:
        pytest.fail(f"{where}: exited 0, but raised (in a thread?)\n{_output(out, err)}", pytrace=False)
    return out


def _output(out: str, err: str) -> str:
    return f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-5000:]}"


def _script(blocks: list[Block], prelude: str) -> str:
    """The Python blocks at their own line numbers (tracebacks then name the doc's
    lines), everything else blank; ``prelude`` on line 1, which is never code."""
    last = blocks[-1].line + blocks[-1].code.count("\n") + 1
    lines = [""] * (last + 1)
    lines[0] = prelude
    for b in blocks:
        for k, text in enumerate(b.code.split("\n")):
            lines[b.line + k] = text
    return "\n".join(lines) + "\n"


def _run_python(blocks: list[Block], dirs: dict, env: dict, gpu: bool, run: str = "") -> str:
    """Runs the blocks as one script; returns its stdout. ``run`` names the run in messages."""
    prelude = "import reprise.torch; reprise.torch.emulate_cuda(True)" if gpu and not _cuda() else ""
    # Named like the doc, so that a traceback reads 'File ".../docs/remote.md", line 57'.
    script = dirs["scripts"] / blocks[0].doc
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_script(blocks, prelude))
    where = ", ".join(b.where for b in blocks) + run
    if blocks[0].torchrun:
        torchrun = shutil.which("torchrun")
        if torchrun is None:
            pytest.skip("needs torchrun (pip install torch)")
        argv = [torchrun, "--standalone", "--nproc-per-node", str(blocks[0].torchrun), str(_torchrun_main(script))]
        return _run(argv, where, dirs["work"], env, TORCHRUN_TIMEOUT)
    return _run([sys.executable, str(script)], where, dirs["work"], env, TIMEOUT, traceback_fails=True)


def _torchrun_main(script: Path) -> Path:
    """A launcher that runs ``script`` as ``__main__`` and, once it returned, leaves with
    ``os._exit(0)``: gloo's worker threads sometimes abort the interpreter's own teardown
    ("terminate called without an active exception") even after ``destroy_process_group``
    (pytorch/pytorch#190489, #179291), after everything the snippet does has run and been
    printed. An exception in the snippet still prints its traceback and fails the rank."""
    main = script.with_name(script.name + ".torchrun.py")
    main.write_text(
        "import os, runpy, sys\n"
        f"sys.argv = [{str(script)!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
        "sys.stdout.flush(); sys.stderr.flush()\n"
        "os._exit(0)\n")
    return main


def _missing_tools(case: Case) -> list[str]:
    """The optional commands (``OPTIONAL_TOOLS``) the case's shell blocks start that are
    not on PATH: the first word of each command, after a line start, ``;``, ``&``, ``|``
    or ``(``."""
    used = {m.group(1) for b in case.blocks if b.language == "bash"
            for m in re.finditer(r"(?:^|[;&|(])\s*([\w.-]+)", b.code, re.M)}
    return sorted(t for t in used & set(OPTIONAL_TOOLS) if shutil.which(t) is None)


def _reruns(case: Case) -> bool:
    """Whether the case is run twice: Python alone, not under torchrun."""
    return all(b.language == "python" and not b.torchrun for b in case.blocks)


def _run_python_twice(blocks: list[Block], dirs: dict, gpu: bool) -> None:
    """Runs the blocks, then again in the same directories: the second run must print
    what the first did. Where it does not, a third run in fresh directories decides: if
    it prints what the first did, the second run saw what the first left behind and the
    test fails; if not, the output is not deterministic and is not compared."""
    first = _run_python(blocks, dirs, dirs["env"], gpu)
    again = _run_python(blocks, dirs, dirs["env"], gpu, run=" (run again in the same directory)")
    if again == first:
        return
    fresh = dirs["fresh"]
    if _run_python(blocks, fresh, fresh["env"], gpu, run=" (run in fresh directories)") == first:
        diff = "".join(difflib.unified_diff(first.splitlines(True), again.splitlines(True), "first run",
                                            "run again in the same directory", n=1))
        pytest.fail(f"{blocks[0].where}: prints something else when run again, though a run in fresh "
                    f"directories prints the same: it keeps state outside its run (a fixed path in "
                    f"$TMPDIR or the working directory?); use a fresh temporary directory\n{diff[-3000:]}",
                    pytrace=False)


def _serve_toml(block: Block, dirs: dict, env: dict):
    """Serves the config with ``reprise serve`` and makes a round trip to each table."""
    import reprise as rp
    from reprise.server_config import load_config

    work = dirs["work"]
    (work / "reprise.toml").write_text(block.code + "\n")
    config = load_config(str(work / "reprise.toml"))
    served = work / ".served.toml"
    served.write_text(re.sub(r'^(\s*\w*address\s*=\s*)"[^"]*"', r'\1"127.0.0.1:0"', block.code, flags=re.M) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "reprise.cli", "serve", "--config", str(served)], cwd=work, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    banner = []
    reader = threading.Thread(target=lambda: banner.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(TIMEOUT)
    try:
        line = banner[0] if banner else ""
        match = re.search(r" at (\S+) \(local: (unix://\S+?)[,)]", line)
        if match is None:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            pytest.fail(f"{block.where}: reprise serve did not start: {line!r}\n{err[-3000:]}", pytrace=False)
        token = config.get("token")
        if token is None and "token_file" in config:
            token = (work / config["token_file"]).read_text().strip()
        # gRPC on the remote address; over TLS, whose CA the config does not name, the local socket.
        client = (rp.Client(match.group(2)) if "tls" in config else
                  rp.Client(match.group(1), token=token, connect_timeout=TIMEOUT))
        stores = {s["name"]: s for s in config["stores"]}
        with client:
            info = client.info()
            for t in config["tables"]:
                fields = stores[t["store"]]["fields"]
                step = {name: np.zeros(f.get("shape", ()), f.get("dtype", "float32")) for name, f in fields.items()}
                with client.writer(t["name"]) as w:
                    for _ in range(max(1, info[t["name"]]["rate_limiter"]["min_size_to_sample"])):
                        w.append(step)
                        w.create_item(t["name"], num_steps=1, priority=1.0)
                    w.flush(timeout=TIMEOUT)
                assert len(client.sample(t["name"], 1, timeout=TIMEOUT)) == 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"{block.where}: reprise serve exited {proc.returncode}\n{out}\n{err[-3000:]}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        served.unlink()


class _Processes:
    """The processes whose environment carries ``CASE_ENV=token``: the case's processes and
    their children. A thread notes them every 0.1 s while they live, so that the store files
    in /dev/shm (named ``reprise-<pid>-...``) of those already gone are still known as ours;
    other sessions of this user make and leave store files at the same time."""

    def __init__(self, token: str):
        self._marker = f"{CASE_ENV}={token}".encode() + b"\0"
        self.pids: set[int] = set()
        self._seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _note(self):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in self._seen:
                try:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        ours = self._marker in f.read()
                except OSError:
                    continue
                self._seen.add(int(entry))
                if ours:
                    self.pids.add(int(entry))

    def _watch(self):
        while not self._stop.wait(0.1):
            self._note()

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join()
        self._note()
        return self.pids


def _store_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if re.match(r"reprise-\d+-", f)} if os.path.isdir("/dev/shm") else set()


def _make_dirs(base: Path, token: str) -> dict:
    made = {name: base / name for name in ("work", "tmp", "run", "scripts")}
    for d in made.values():
        d.mkdir(mode=0o700, parents=True)
    made["env"] = dict(os.environ, TMPDIR=str(made["tmp"]), XDG_RUNTIME_DIR=str(made["run"]), PYTHONUNBUFFERED="1",
                       OMP_NUM_THREADS="1", **{CASE_ENV: token})
    made["env"].pop("REPRISE_TOKEN", None)
    return made


@pytest.fixture
def dirs():
    """A short-named temporary directory (socket paths are limited to 107 bytes) with
    work/ (the working directory), tmp/ ($TMPDIR), run/ ($XDG_RUNTIME_DIR) and scripts/,
    the environment with the token that marks the case's processes (``env``), and
    ``fresh``: the same again, for a run from scratch. Fails the test if the case left a
    store file in /dev/shm or a file in a runtime directory."""
    base = Path(tempfile.mkdtemp(prefix="reprise-docs-"))
    token = uuid.uuid4().hex
    made = _make_dirs(base, token)
    made["fresh"] = _make_dirs(base / "fresh", token)   # a second set, for a run from scratch
    before = _store_files()
    processes = _Processes(token)
    yield made
    try:
        ours = processes.stop()
        left = sorted(f for f in _store_files() - before if int(f.split("-")[1]) in ours)
        for f in left:   # reported below; removed so that a failed run leaves nothing either
            if not Path(f"/proc/{f.split('-')[1]}").exists():
                os.unlink(f"/dev/shm/{f}")
        assert not left, f"store files left in /dev/shm: {left}"
        left = [str(p.relative_to(d)) for d in (made["run"], made["fresh"]["run"]) for p in d.rglob("*")
                if not p.is_dir()]
        assert not left, f"left in $XDG_RUNTIME_DIR: {left}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_snippet(case: Case, dirs):
    bad = [b.problem for b in case.blocks if b.problem]
    if bad:
        pytest.fail("\n".join(bad), pytrace=False)
    if case.skip is not None:
        pytest.skip(f"{case.id}: {case.skip}")
    gpu = any(b.gpu for b in case.blocks)
    if case.needs_cuda and not _cuda():
        pytest.skip(f"{case.id}: needs a CUDA GPU")
    if gpu and _cuda() is None:
        pytest.skip(f"{case.id}: the GPU path needs torch")
    missing = _missing_tools(case)
    if missing:
        pytest.skip(f"{case.id}: needs " + ", ".join(f"`{t}` (apt-get install {OPTIONAL_TOOLS[t]})" for t in missing))
    if _reruns(case):
        _run_python_twice(case.blocks, dirs, gpu)
        return
    env = dirs["env"]
    pending: list[Block] = []   # consecutive Python blocks: one process
    for block in case.blocks + [None]:
        if block is not None and block.language == "python":
            pending.append(block)
            continue
        if pending:
            _run_python(pending, dirs, env, gpu)
            pending = []
        if block is None:
            break
        if block.language == "bash":
            _run(["bash", "-euo", "pipefail"], block.where, dirs["work"], env, TIMEOUT, stdin=block.code)
        else:
            _serve_toml(block, dirs, env)


# -- the harness catches what it should -------------------------------------------------

def _snippet(code: str) -> list[Block]:
    return [Block("t.md", 3, "python", code)]


@pytest.mark.parametrize("code, message", [
    # A property called as a method (docs/observability.md once had `t.local_table().stats()`).
    ("import reprise as rp\n"
     "store = rp.Store({'x': rp.Field((), 'int64')}, capacity=16)\n"
     "print(rp.Table('t', store).size())\n", "TypeError: 'int' object is not callable"),
    ("raise SystemExit('a snippet that gives up')\n", "exit status 1"),
    # An exception in a thread leaves the exit status 0.
    ("import threading\n"
     "t = threading.Thread(target=lambda: 1 / 0)\n"
     "t.start(); t.join()\n", "ZeroDivisionError"),
], ids=["a-property-called", "an-exit", "a-thread-raises"])
def test_a_snippet_that_raises_fails(code, message, dirs):
    with pytest.raises(pytest.fail.Exception) as e:
        _run_python_twice(_snippet(code), dirs, gpu=False)
    assert message in str(e.value), str(e.value)
    assert "SystemExit" in code or 't.md", line ' in str(e.value), str(e.value)   # the traceback names the doc


def test_a_snippet_that_keeps_state_outside_its_run_fails(dirs):
    """As docs/checkpoints.md's server example once did, with a checkpoint directory at
    a fixed path in $TMPDIR: its second run restored the first one's checkpoint."""
    code = ("import os, tempfile\n"
            "path = os.path.join(tempfile.gettempdir(), 'runs')\n"
            "runs = int(open(path).read()) if os.path.exists(path) else 0\n"
            "open(path, 'w').write(str(runs + 1))\n"
            "print('earlier runs:', runs)\n")
    with pytest.raises(pytest.fail.Exception, match="prints something else when run again"):
        _run_python_twice(_snippet(code), dirs, gpu=False)


def test_a_snippet_whose_output_is_not_deterministic_passes(dirs):
    _run_python_twice(_snippet("import os\nprint(os.getpid())\n"), dirs, gpu=False)


# -- prose: properties are not called ----------------------------------------------------

MODULE_ALIASES = {"rp": "reprise", "np": "numpy", "dist": "torch.distributed"}


@functools.cache
def _properties() -> frozenset[str]:
    """Names that are properties (or native getters) of a class of ``reprise`` and
    methods of none: ``x.name(...)`` is a ``TypeError`` wherever it is written."""
    import reprise
    props, methods, seen = set(), set(), set()
    for info in pkgutil.walk_packages(reprise.__path__, "reprise."):
        if info.name.startswith(("reprise.examples", "reprise.__main__")):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional dependency missing: its classes are not checked
            continue
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls in seen:
                continue
            seen.add(cls)
            for klass in cls.__mro__:
                if not (getattr(klass, "__module__", "") or "").startswith("reprise"):
                    continue
                for name, value in vars(klass).items():
                    if name.startswith("_"):
                        continue
                    if isinstance(value, property) or inspect.isgetsetdescriptor(value):
                        props.add(name)
                    elif callable(value) or isinstance(value, (staticmethod, classmethod)):
                        methods.add(name)
    # Methods of the types the docs' code also handles: `optimizer.step()` and `tensor.size(0)`
    # are right, whatever a Reprise class calls `step` or `size`.
    others = [np.ndarray, Path, str, dict, list, threading.Thread, subprocess.Popen]
    if _cuda() is not None:
        import torch
        others += [torch.Tensor, torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]
    methods |= {name for kind in others for name in dir(kind) if callable(getattr(kind, name, None))}
    return frozenset(props - methods)


def _is_module(dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    name = ".".join(filter(None, [MODULE_ALIASES.get(head, head), rest]))
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _called_properties(text: str, doc: str) -> list[str]:
    pattern = re.compile(r"([A-Za-z_][\w.]*)\.(" + "|".join(sorted(_properties())) + r")\(")
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        for m in pattern.finditer(line):
            if not _is_module(m.group(1)):   # torch.device(...), rp.distributed.consumers(...)
                found.append(f"{doc}:{number}: {m.group(0)} ('{m.group(2)}' is a property: no parentheses)")
    return found


def test_the_docs_call_no_property_as_a_method():
    assert {"local_table", "tables", "signature", "free_blocks"} <= _properties()
    assert _called_properties("a `t.local_table().stats()` and `torch.device('cpu')`", "t.md") == [
        "t.md:1: t.local_table( ('local_table' is a property: no parentheses)"]
    found = [f for path in DOCS for f in _called_properties(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert not found, "\n".join(found)


def test_a_shell_block_needing_a_missing_tool_is_skipped_naming_it(monkeypatch):
    blocks, _ = parse("# t\n\n```bash\nreprise serve --config x.toml & pid=$!\nopenssl req -x509 | tee ca.pem\n"
                      "sleep 1 && curl -s http://x/ | jq .\n```\n", "t.md")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert _missing_tools(Case("t.md:3", blocks)) == ["curl", "jq", "openssl"]
