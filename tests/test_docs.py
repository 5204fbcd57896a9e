"""Every code block of README.md and docs/*.md runs as written.

Fenced blocks labelled ``python``, ``toml`` or ``bash``/``sh``/``shell`` are collected;
unlabelled fences are text (output, signatures, layouts) and are not run. Each block
runs in a fresh subprocess with a timeout, in a temporary directory that also holds
``$TMPDIR`` and ``$XDG_RUNTIME_DIR`` (so servers' sockets land there), and the test
fails if the block leaves a store file in /dev/shm or anything in the runtime
directory. Test ids name the file and line of the fence: ``docs/remote.md:42``.

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
import functools
import os
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


def _run(argv, where: str, cwd: Path, env: dict, timeout: float, stdin: str | None = None):
    """Runs ``argv`` in a session of its own and fails the test, with its output, on a
    non-zero exit. A process still running after ``timeout`` (or still holding the
    pipes: a child left behind) is killed with its whole session."""
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


def _run_python(blocks: list[Block], dirs: dict, env: dict, gpu: bool):
    prelude = "import reprise.torch; reprise.torch.emulate_cuda(True)" if gpu and not _cuda() else ""
    # Named like the doc, so that a traceback reads 'File ".../docs/remote.md", line 57'.
    script = dirs["scripts"] / blocks[0].doc
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(_script(blocks, prelude))
    where = ", ".join(b.where for b in blocks)
    if blocks[0].torchrun:
        torchrun = shutil.which("torchrun")
        if torchrun is None:
            pytest.skip("needs torchrun (pip install torch)")
        argv = [torchrun, "--standalone", "--nproc-per-node", str(blocks[0].torchrun), str(script)]
        _run(argv, where, dirs["work"], env, TORCHRUN_TIMEOUT)
    else:
        _run([sys.executable, str(script)], where, dirs["work"], env, TIMEOUT)


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


@pytest.fixture
def dirs():
    """A short-named temporary directory (socket paths are limited to 107 bytes) with
    work/ (the working directory), tmp/ ($TMPDIR), run/ ($XDG_RUNTIME_DIR) and scripts/,
    and the token that marks the case's processes (``env``). Fails the test if the case
    left a store file in /dev/shm or a file in its runtime directory."""
    base = Path(tempfile.mkdtemp(prefix="reprise-docs-"))
    made = {name: base / name for name in ("work", "tmp", "run", "scripts")}
    for d in made.values():
        d.mkdir(mode=0o700)
    token = uuid.uuid4().hex
    made["env"] = dict(os.environ, TMPDIR=str(made["tmp"]), XDG_RUNTIME_DIR=str(made["run"]), PYTHONUNBUFFERED="1",
                       OMP_NUM_THREADS="1", **{CASE_ENV: token})
    made["env"].pop("REPRISE_TOKEN", None)
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
        left = [str(p.relative_to(made["run"])) for p in made["run"].rglob("*") if not p.is_dir()]
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
