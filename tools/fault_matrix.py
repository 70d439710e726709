"""The fault matrix: every bertforge command against bad input, wrong and damaged folders of every
kind, signals at random moments, full and read-only disks and a second process at once, each case's
outcome checked against docs/faults.md and the README's rules (one `bertforge: error:` line, exit
status 2, no traceback, nothing half-written; a signal: exit 130 or 143 and an exact resume).

    .venv/bin/python tools/fault_matrix.py --out DIR [--only PATTERN] [--seed N] [--exec] [--list]

Writes DIR/fault-matrix.md (case, command, expected, result, and the counts), keeps the fixtures and
every case's folders under DIR/work (`$W` in the commands) and each command's output under DIR/logs.
Exit status 0 when no case fails, 1 when one does. `--only` keeps the cases whose name contains one
of its comma-separated parts (or matches it, with * or ?); `--seed` picks the random moments.

Each command runs as a child forked from this process after bertforge is imported (a fresh Python
spends seconds importing torch); `--exec` runs each as `python -m bertforge` instead. Full and
read-only disks are tmpfs mounts in a private mount namespace (as root, or through an unprivileged
user namespace); where neither is allowed, those cases are skipped.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import datetime
import fnmatch
import gzip
import hashlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cmd(template: str, *values) -> list:
    """Command-line arguments: the template's words, each `{}` replaced by the next of `values` and
    each `{*}` by the items of the next (a list of arguments)."""
    found, rest = [], iter(values)
    for word in template.split():
        if word == "{}":
            found.append(next(rest))
        elif word == "{*}":
            found.extend(next(rest))
        else:
            found.append(word)
    return found


DATA = ROOT.parent / "shared" / "data"
WIKI_TRAIN = DATA / "wikitext-2" / "wiki.train.tokens"
WIKI_VALID = DATA / "wikitext-2" / "wiki.valid.tokens"
SST = DATA / "sst-2"
GLUE = DATA / "glue"

# A model small enough to train in seconds, the same arithmetic in every process.
TINY = cmd(
    "--set model.num_hidden_layers=2 --set model.hidden_size=32 --set model.num_attention_heads=2 "
    "--set model.intermediate_size=64 --set model.max_position_embeddings=64 --set data.max_seq_length=64 "
    "--set train.batch_size=8 --set runtime.precision=fp32 --set runtime.threads=1 --quiet"
)
# A run to stop at a random step: a line per step, a checkpoint every 10 steps, no evaluation.
STEADY = cmd("--set train.log_every=1 --set train.eval_every=100000 --set train.checkpoint_every=10")
STEADY_STEPS = 120
GPT = ["--objective", "clm", "--set", "model.intermediate_size=128"]  # OpenAIGPT's width: 4 x hidden
FINETUNE_FLAGS = cmd(
    "--text-column sentence --label-column label --max-length 32 --batch-size 8 --precision fp32 --quiet"
)
TINY_RECIPES = "[default]\nlearning_rate = 3e-3\nepochs = 1\nbatch_size = 8\nmax_length = 32\nwarmup = 0.0\n"
LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?P<tag>tmp|old|del)-\w+$")  # bertforge.io's temporaries
SPEEDS = ("tokens_per_s", "elapsed_s", "seconds", "elapsed", "minutes")

REFUSED = "one `bertforge: error:` line, exit 2, no traceback"
OK = "exit 0, no traceback"
EITHER = "exit 0, or " + REFUSED


class Fail(Exception):
    """The case's outcome breaks a promise; the message says which."""


class Skip(Exception):
    """The case cannot run here (no mount namespace, a moment that could not be caught)."""


# ------------------------------------------------------------------------------------ the matrix


@dataclass
class Case:
    name: str
    expected: str
    body: Callable[[Trace], None]
    disk: bool = False  # runs in a private mount namespace, where it mounts its disks


@dataclass
class Outcome:
    case: Case
    commands: list[str]
    result: str  # "pass", "FAIL: why" or "skip: why"
    seconds: float


class Matrix:
    """Where this run writes, how it starts commands, and its fixtures."""

    def __init__(self, out: Path, seed: int, exec_mode: bool) -> None:
        self.out, self.seed, self.exec_mode = out.resolve(), seed, exec_mode
        self.work, self.logs = self.out / "work", self.out / "logs"
        self.cache = self.work / "cache"
        self.world = World(self.work / "fixtures")
        self.fixture_commands: list[str] = []


M: Matrix  # set by main()


# --------------------------------------------------------------------------- running a command


@dataclass
class Result:
    code: int  # the exit status; -N when signal N killed the process
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    def describe(self) -> str:
        """The exit status and the last line on stderr (for a traceback, its exception)."""
        status = f"killed by {signal.Signals(-self.code).name}" if self.code < 0 else f"exit {self.code}"
        last = self.lines[-1] if self.lines else "(nothing on stderr)"
        raised = [line for line in self.lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
        if "Traceback (most recent call last)" in self.err and raised:
            ignored = "Exception ignored in atexit callback" in self.err
            last = raised[-1].rstrip(": ") + (" in an atexit callback, as it exits" if ignored else "")
        return f"{status}: {last[:300]}"


def read_log(path: Path) -> str:
    """A command's stdout or stderr; empty if it was killed before the forked child opened it."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


class Proc:
    """One bertforge command in its own process group: forked from this process, or a new Python."""

    def __init__(self, argv: list[str], log: Path, cwd: Path, env: dict[str, str]) -> None:
        self.argv, self.log, self.code = argv, log, None
        stdout, stderr = log.parent / f"{log.name}.out", log.parent / f"{log.name}.err"
        self.paths = stdout, stderr
        if M.exec_mode:
            with stdout.open("wb") as out, stderr.open("wb") as err:
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", "bertforge", *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    cwd=cwd,
                    env={**os.environ, **env},
                    start_new_session=True,
                    preexec_fn=default_signals,
                )
            self.pid = self.popen.pid
            return
        self.popen = None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            run_forked(argv, stdout, stderr, cwd, env)

    def poll(self) -> int | None:
        if self.code is None:
            if self.popen is not None:
                self.code = self.popen.poll()
            else:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.code = os.waitstatus_to_exitcode(status)
        return self.code

    def wait(self, timeout: float = 300) -> Result:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise Fail(f"`bertforge {' '.join(self.argv[:2])}` did not end within {timeout:.0f} s")
            time.sleep(0.02)
        return self.result()

    def result(self) -> Result:
        out, err = (read_log(path) for path in self.paths)
        return Result(self.code, out, err)

    def send(self, signum: int, group: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)

    def kill(self) -> None:
        if self.poll() is None:
            self.send(signal.SIGKILL, group=True)
            while self.poll() is None:
                time.sleep(0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # whatever it started


def default_signals() -> None:
    """Ctrl-C and SIGTERM as a fresh process in a terminal has them, whatever this one inherited."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_forked(argv: list[str], stdout: Path, stderr: Path, cwd: Path, env: dict[str, str]) -> None:
    """In the forked child: `bertforge ARGV` as `python -m bertforge` would run it, then exit."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, stdout), (2, stderr)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(handle, fd)
            os.close(handle)
        os.chdir(cwd)
        os.environ.update(env)
        default_signals()
        code = bertforge_main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def warm_imports() -> None:
    """Import what every command imports, once, before the first fork: bertforge's modules and
    torch._dynamo (which torch imports at the first random initialisation). Nothing here runs a
    torch operation, so that the children start from a process without a thread pool."""
    import importlib
    import pkgutil

    import bertforge

    for module in pkgutil.walk_packages(bertforge.__path__, "bertforge."):
        importlib.import_module(module.name)
    importlib.import_module("torch._dynamo")


def bertforge_main(argv: list[str]) -> int:
    """The exit status Python gives `python -m bertforge ARGV` (`raise SystemExit(run())`, run reading
    sys.argv), uncaught exceptions included."""
    from bertforge.cli import run

    sys.argv = ["bertforge", *argv]
    try:
        status = run()
    except SystemExit as stop:
        status = stop.code
    except KeyboardInterrupt:  # uncaught: Python prints it and dies of SIGINT
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        status = 130
    atexit._run_exitfuncs()
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    print(status, file=sys.stderr)
    return 1


# ------------------------------------------------------------------------------------- a case


class Trace:
    """One case: its folder, the commands it ran (shown in the table), its processes and disks."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.slug = re.sub(r"[^\w.-]+", "_", name)
        self.dir = M.work / "cases" / self.slug
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.lines: list[str] = []
        self.procs: list[Proc] = []
        self.rng = random.Random(f"{M.seed}:{name}")
        self.after: Callable[[], None] | None = None  # a last check, once the case's commands ran

    def start(self, *argv, env: dict[str, str] | None = None, cwd: Path | None = None) -> Proc:
        argv = [str(part) for part in argv]
        env = {"BERTFORGE_CACHE": str(M.cache), **(env or {})}
        self.lines.append(render(argv, env))
        log = M.logs / f"{self.slug}.{len(self.procs) + 1}"
        self.procs.append(Proc(argv, log, cwd or self.dir, env))
        return self.procs[-1]

    def bf(self, *argv, env: dict[str, str] | None = None, timeout: float = 300) -> Result:
        return self.start(*argv, env=env).wait(timeout)

    def note(self, line: str) -> None:
        self.lines.append(shorten(line))

    def path(self, name: str) -> Path:
        return self.dir / name

    def copy(self, fixture: str, name: str | None = None) -> Path:
        """A copy of a fixture (or a folder of one, "bert/final") in the case's folder."""
        source = M.world[fixture]
        target = self.dir / (name or Path(fixture).name)
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, target)
        self.note(f"cp -r {source} {target}")
        return target

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()


def render(argv: list[str], env: dict[str, str]) -> str:
    """The shell line of a command, with the matrix's folders and flag sets as placeholders."""
    line = shlex.join(["bertforge", *argv])
    for flags, name in ((TINY, "$TINY"), (STEADY, "$STEADY"), (FINETUNE_FLAGS, "$FT")):
        line = line.replace(shlex.join(flags), name)
    cache = env.get("BERTFORGE_CACHE")
    prefix = "" if cache == str(M.cache) else f"BERTFORGE_CACHE={cache} "
    return shorten(prefix + line)


def shorten(line: str) -> str:
    return line.replace(str(M.work), "$W").replace(str(DATA), "$DATA")


# ------------------------------------------------------------------------------------ checks


def refused(result: Result, *words: str) -> str:
    """One `bertforge: error:` line (after any warning lines) or argparse's usage and error, exit
    status 2, no traceback; the line names each of `words`. Returns the error line."""
    lines = result.lines
    if "Traceback (most recent call last)" in result.err:
        raise Fail(f"a traceback ({result.describe()})")
    if result.code != 2:
        raise Fail(f"expected exit 2, got {result.describe()}")
    errors = [line for line in lines if line.startswith("bertforge: error:")]
    if not errors and lines and re.match(r"bertforge [\w -]+: error: ", lines[-1]) and "usage:" in result.err:
        errors = [lines[-1]]  # argparse: usage, then one error line
    elif len(errors) != 1 or len(lines) != len(errors) + warnings(lines) + progress(lines):
        raise Fail(f"not one error line: {' / '.join(lines)[:400]}")
    for word in words:
        if word.lower() not in errors[0].lower():
            raise Fail(f"the error line does not name {word!r}: {errors[0][:300]}")
    if "[Errno" in errors[0] and ";" not in errors[0]:
        raise Fail(f"a raw OS error, without a word on what to do: {errors[0][:300]}")
    return errors[0]


def warnings(lines: list[str]) -> int:
    return sum(line.startswith("bertforge: warning:") for line in lines)


def progress(lines: list[str]) -> int:
    """Progress lines (bertforge.progress's plain lines where stderr is no terminal)."""
    return sum(bool(re.match(r"^[^:]+: +\d+% \(", line)) for line in lines)


def succeeded(result: Result) -> None:
    if "Traceback (most recent call last)" in result.err:
        raise Fail(f"a traceback ({result.describe()})")
    if result.code != 0:
        raise Fail(f"expected exit 0, got {result.describe()}")


def either(result: Result, *words: str) -> bool:
    """Exit 0, or a clean refusal; True when it succeeded."""
    if result.code == 0 and "Traceback (most recent call last)" not in result.err:
        return True
    refused(result, *words)
    return False


def snapshot(path: Path) -> dict[str, str]:
    """Every file under `path` (or `path` itself) by relative name, with its sha256."""
    if not path.exists():
        return {}
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def fingerprint(path: Path) -> dict[str, tuple]:
    """Every file under `path` with its size and modification time: cheap, for the fixtures."""
    files = [path] if path.is_file() else sorted(path.rglob("*"))
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists()}


def unchanged(path: Path, before: dict[str, str]) -> None:
    after = snapshot(path)
    if after != before:
        changed = sorted(
            set(before) ^ set(after) | {k for k in before if after.get(k, before[k]) != before[k]}
        )
        raise Fail(f"{shorten(str(path))} changed: {', '.join(changed[:6]) or 'its files'}")


def absent(path: Path) -> None:
    """Nothing written under `path`'s name, and no temporary left beside it."""
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise Fail(f"{shorten(str(path))} was written")
    no_leftovers(path.parent)


def no_leftovers(folder: Path) -> None:
    found = [p for p in folder.rglob(".*") if LEFTOVER.match(p.name)] if folder.is_dir() else []
    if found:
        raise Fail(f"leftovers: {', '.join(shorten(str(p)) for p in found[:4])}")


def tensors(path: Path) -> dict[str, str]:
    """A safetensors file's tensors by name: dtype, shape and the sha256 of their bytes (read here,
    without torch, so that this process stays fit to fork)."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    body = data[8 + size :]
    found = {}
    for name, info in header.items():
        if name != "__metadata__":
            digest = hashlib.sha256(body[slice(*info["data_offsets"])]).hexdigest()
            found[name] = f"{info['dtype']}{info['shape']}:{digest}"
    return found


def same_weights(path: Path, reference: Path) -> None:
    if not path.is_file():
        raise Fail(f"{shorten(str(path))} is missing")
    ours, theirs = tensors(path), tensors(reference)
    differ = [name for name in theirs if ours.get(name) != theirs[name]]
    if differ or ours.keys() != theirs.keys():
        raise Fail(f"{len(differ)} of {len(theirs)} tensors differ from {shorten(str(reference))}")


def train_lines(run: Path) -> list[dict]:
    lines = []
    try:
        text = (run / "metrics.jsonl").read_text()
    except FileNotFoundError:  # not yet written, or removed by a resume that starts the run afresh
        text = ""
    for line in text.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if record.get("split") == "train":
                lines.append({k: v for k, v in record.items() if k not in SPEEDS})
    return lines


def same_metrics(run: Path, reference: Path) -> None:
    ours, theirs = train_lines(run), train_lines(reference)
    if ours != theirs:
        steps = [r.get("step") for r in ours]
        raise Fail(f"metrics.jsonl differs from the reference's (steps {steps[:3]}...{steps[-3:]})")


def same_run(run: Path, reference: Path) -> None:
    """A pretraining run that ends as the uninterrupted reference: weights and training lines."""
    same_weights(run / "final" / "model.safetensors", reference / "final" / "model.safetensors")
    same_metrics(run, reference)


def wait_until(condition: Callable[[], bool], proc: Proc, seconds: float = 120, tick: float = 0.02) -> bool:
    """True once `condition` holds; False when the process ended first."""
    deadline = time.monotonic() + seconds
    while not condition():
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise Fail(f"timed out waiting for {proc.argv[0]}")
        time.sleep(tick)
    return True


def continue_command(result: Result) -> list[str]:
    """The command a stopped run printed (`continue with: bertforge ...`), as arguments."""
    match = re.search(r"continue with: bertforge (.+)$", result.err.strip().splitlines()[-1])
    if not match:
        raise Fail(f"no `continue with:` command: {result.describe()}")
    return shlex.split(match.group(1))


# ------------------------------------------------------------------------ disks (tmpfs mounts)

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_REMOUNT, MS_REC, MS_PRIVATE = 1, 32, 16384, 1 << 18


def libc_call(name: str, *args) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise Skip(f"{name} is not allowed here: {os.strerror(code)}")


def enter_private_mounts() -> None:
    """This (forked, single-threaded) process gets mounts of its own: root, or a user namespace."""
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        libc_call("unshare", CLONE_NEWNS)
    else:
        libc_call("unshare", CLONE_NEWUSER | CLONE_NEWNS)
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    libc_call("mount", b"none", b"/", None, MS_REC | MS_PRIVATE, None)


def mount_disk(path: Path, free: int, size: int = 64 << 20) -> Path:
    """A tmpfs at `path` with `free` bytes left (the rest taken by a filler file)."""
    path.mkdir(parents=True, exist_ok=True)
    libc_call("mount", b"tmpfs", str(path).encode(), b"tmpfs", 0, f"size={size}".encode())
    fill(path, free)
    return path


def fill(path: Path, free: int) -> None:
    stat = os.statvfs(path)
    take = stat.f_bavail * stat.f_frsize - free
    if take > 0:
        with (path / ".filler").open("wb") as handle:
            os.posix_fallocate(handle.fileno(), 0, take)


def free_disk(path: Path) -> None:
    (path / ".filler").unlink(missing_ok=True)


def read_only(path: Path) -> None:
    libc_call("mount", b"none", str(path).encode(), None, MS_REMOUNT | MS_RDONLY, None)


DISK_FIXTURES = ("data", "tok", "bert", "clf", "glue", "hf", "ref-bert")


def run_in_namespace(case: Case, trace: Trace) -> None:
    """Run `case.body` in a forked child with mounts of its own; its verdict comes back by pipe."""
    read, write = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        verdict = {"result": "pass"}
        try:
            enter_private_mounts()
            case.body(trace)
        except Fail as failure:
            verdict = {"result": f"FAIL: {failure}"}
        except Skip as skip:
            verdict = {"result": f"skip: {skip}"}
        except BaseException as error:
            verdict = {"result": f"FAIL: the matrix itself broke: {error!r}"}
        finally:
            trace.close()
        verdict["lines"] = trace.lines
        os.write(write, json.dumps(verdict).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    verdict = json.loads(text) if text else {"result": "FAIL: the case's process died", "lines": []}
    trace.lines = verdict["lines"]
    kind, _, why = verdict["result"].partition(": ")
    if kind == "FAIL":
        raise Fail(why)
    if kind == "skip":
        raise Skip(why)


# ----------------------------------------------------------------------------------- fixtures


class World:
    """The folders every case starts from, built once on first use (and kept under --out):
    corpora and data files, a tokenizer, shards, and one folder of each kind bertforge writes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pristine: dict[str, dict[str, tuple]] = {}

    def __getitem__(self, name: str) -> Path:
        top = name.split("/")[0]
        if top not in self.pristine:
            done = self.root / f".{top}.done"
            if not done.exists():
                BUILDERS[top](self.root / top)
                done.write_text("")
            self.pristine[top] = fingerprint(self.root / top)
        return self.root / name

    def changed(self) -> list[str]:
        """Fixtures that a case modified (each is then rebuilt)."""
        modified = [top for top, files in self.pristine.items() if fingerprint(self.root / top) != files]
        for top in modified:
            shutil.rmtree(self.root / top, ignore_errors=True)
            (self.root / f".{top}.done").unlink(missing_ok=True)
            del self.pristine[top]
        return modified


def fixture_run(*argv) -> None:
    trace = FIXTURE_TRACE
    result = trace.bf(*argv)
    M.fixture_commands.append(trace.lines[-1])
    if result.code != 0:
        raise SystemExit(f"fault_matrix: building a fixture failed: {trace.lines[-1]}\n{result.err[-3000:]}")


def head(source: Path, target: Path, lines: int, skip: int = 0) -> None:
    with source.open(encoding="utf-8") as handle:
        rows = handle.readlines()[skip : skip + lines]
    target.write_text("".join(rows), encoding="utf-8")


def build_glue_data(folder: Path) -> None:
    """GLUE's layout with one small task: RTE's first 64 training and 32 dev pairs."""
    (folder / "RTE").mkdir(parents=True)
    head(GLUE / "rte" / "train.tsv", folder / "RTE" / "train.tsv", 65)
    head(GLUE / "rte" / "dev.tsv", folder / "RTE" / "dev.tsv", 33)
    M.fixture_commands.append(
        f"$W/fixtures/glue-data/RTE: the first 64 and 32 pairs of $DATA/glue/rte ({folder})"
    )


def conll_head(source: Path, target: Path, sentences: int) -> None:
    """The first `sentences` sentences of a CoNLL file (a blank line after each)."""
    lines, count = [], 0
    for line in source.read_text(encoding="utf-8").splitlines():
        lines.append(line)
        count += not line.strip()
        if count == sentences:
            break
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")


def build_data(folder: Path) -> None:
    folder.mkdir(parents=True)
    head(WIKI_TRAIN, folder / "train.tokens", 1500)
    head(WIKI_VALID, folder / "valid.tokens", 300)
    head(SST / "train.tsv", folder / "sst-train.tsv", 65)
    head(SST / "train.tsv", folder / "sst-train-128.tsv", 129)
    head(SST / "dev.tsv", folder / "sst-dev.tsv", 33)
    head(GLUE / "stsb" / "train.tsv", folder / "stsb-train.tsv", 65)
    head(GLUE / "stsb" / "dev.tsv", folder / "stsb-dev.tsv", 33)
    conll_head(DATA / "conll2003" / "train.txt", folder / "conll-train.txt", 80)
    conll_head(DATA / "conll2003" / "dev.txt", folder / "conll-dev.txt", 30)
    sentences = [
        line.strip() for line in WIKI_VALID.read_text(encoding="utf-8").splitlines() if len(line) > 40
    ]
    (folder / "lines.txt").write_text("\n".join(s[:200] for s in sentences[:24]) + "\n", encoding="utf-8")
    (folder / "few-lines.txt").write_text("\n".join(s[:200] for s in sentences[:12]) + "\n", encoding="utf-8")
    (folder / "many-lines.txt").write_text("\n".join(s[:200] for s in sentences) * 4 + "\n", encoding="utf-8")
    (folder / "recipes.toml").write_text(TINY_RECIPES + "max_train_examples = 32\n", encoding="utf-8")
    long = TINY_RECIPES.replace("epochs = 1", "epochs = 3") + "max_train_examples = 64\n"
    (folder / "recipes-long.toml").write_text(long, encoding="utf-8")
    M.fixture_commands.append(
        f"$W/fixtures/data: slices of $DATA's wikitext-2, sst-2, glue/stsb and conll2003 ({folder})"
    )


def data(name: str) -> Path:
    return M.world["data/" + name]


def build_tok(out: Path) -> None:
    fixture_run("tokenizer", "train", "--corpus", data("train.tokens"), "--vocab-size", "1000", "--out", out)


def pretrain_argv(out: Path, *extra, corpus: str = "train.tokens") -> list:
    return ["pretrain", "--corpus", data(corpus), "--tokenizer", M.world["tok"], "--out", out, *TINY, *extra]


def build_bert(out: Path) -> None:
    extra = ["--valid", data("valid.tokens"), "--max-steps", "6", "--set", "train.eval_every=3"]
    fixture_run(*pretrain_argv(out, *extra, "--set", "train.checkpoint_every=2"))


def build_gpt(out: Path) -> None:
    fixture_run(*pretrain_argv(out, *GPT, "--max-steps", "4", "--set", "train.eval_every=2"))


def finetune_argv(model: Path, out: Path, *extra, train: str = "sst-train.tsv") -> list:
    return cmd(
        "finetune --model {} --train {} --valid {} --out {} --epochs 1 {*} {*}",
        model,
        data(train),
        data("sst-dev.tsv"),
        out,
        FINETUNE_FLAGS,
        extra,
    )


def build_clf(out: Path) -> None:
    fixture_run(*finetune_argv(M.world["bert"], out))


def build_reg(out: Path) -> None:
    fixture_run(
        "finetune",
        "--model",
        M.world["bert"],
        "--train",
        data("stsb-train.tsv"),
        "--valid",
        data("stsb-dev.tsv"),
        "--text-column",
        "sentence1",
        "--text-pair-column",
        "sentence2",
        "--label-column",
        "score",
        "--out",
        out,
        "--epochs",
        "1",
        "--max-length",
        "32",
        "--batch-size",
        "8",
        "--precision",
        "fp32",
        "--quiet",
    )


def with_flag(argv: list, flag: str, value) -> list:
    """`argv` with `flag`'s value replaced (or the flag added)."""
    if flag not in argv:
        return [*argv, flag, value]
    argv = list(argv)
    argv[argv.index(flag) + 1] = value
    return argv


def glue_argv(out: Path, *extra, recipes: str = "recipes.toml", seeds: str = "1") -> list:
    return cmd(
        "glue --model {} --data {} --tasks rte --seeds {} --recipes {} --out {} --precision fp32 --quiet {*}",
        M.world["bert"],
        M.world["glue-data"],
        seeds,
        data(recipes),
        out,
        extra,
    )


def build_glue(out: Path) -> None:
    fixture_run(*glue_argv(out))


FIXTURE_TRACE: Trace
BUILDERS: dict[str, Callable[[Path], None]] = {
    "data": build_data,
    "glue-data": build_glue_data,
    "empty": lambda out: out.mkdir(),
    "tok": build_tok,
    "shards": lambda out: fixture_run(
        "prepare", "--corpus", data("train.tokens"), "--tokenizer", M.world["tok"], "--out", out
    ),
    "bert": build_bert,
    "gpt": build_gpt,
    "clf": build_clf,
    "reg": build_reg,
    "glue": build_glue,
    "hf": lambda out: fixture_run("export", "--model", M.world["bert"], "--out", out),
    "hf-clf": lambda out: fixture_run("export", "--model", M.world["clf"], "--out", out),
    "tagger": lambda out: fixture_run(
        *cmd(
            "finetune --model {} --train {} --valid {} --out {} --epochs 1 --max-length 32 --batch-size 8 "
            "--precision fp32 --quiet",
            M.world["bert"],
            data("conll-train.txt"),
            data("conll-dev.txt"),
            out,
        )
    ),
    "hf-gpt": lambda out: fixture_run("export", "--model", M.world["gpt"], "--out", out),
    "imported": lambda out: fixture_run("import-hf", "--from", M.world["hf"], "--out", out),
    # references for the runs that a signal, a kill or a full disk interrupts
    "ref-bert": lambda out: fixture_run(*pretrain_argv(out, *STEADY, "--max-steps", str(STEADY_STEPS))),
    "ref-gpt": lambda out: fixture_run(*pretrain_argv(out, *GPT, *STEADY, "--max-steps", str(STEADY_STEPS))),
    "ref-ft": lambda out: fixture_run(
        *finetune_argv(
            M.world["bert"], out, "--epochs", "2", "--set", "train.log_every=1", train="sst-train-128.tsv"
        )
    ),
    "ref-glue": lambda out: fixture_run(*glue_argv(out, recipes="recipes-long.toml", seeds="1,2")),
    "ref-shards": lambda out: fixture_run(
        "prepare", "--corpus", WIKI_VALID, "--tokenizer", M.world["tok"], "--out", out
    ),
}

# The folder kinds a command may be given, as fixtures (None: a path that does not exist).
KINDS: dict[str, str | None] = {
    "missing": None,
    "file": "data/valid.tokens",
    "empty-folder": "empty",
    "tokenizer": "tok",
    "shards": "shards",
    "pretraining-run": "bert",
    "checkpoint": "bert/checkpoints/step_000006",
    "final": "bert/final",
    "gpt-run": "gpt",
    "finetune-run": "clf",
    "classifier": "clf/final",
    "regression": "reg/final",
    "glue-folder": "glue",
    "hf-export": "hf",
    "hf-classifier": "hf-clf",
    "tagger": "tagger/final",
    "hf-gpt": "hf-gpt",
    "import": "imported",
}
BERTS = {"pretraining-run", "checkpoint", "final", "hf-export", "import"}
GPTS = {"gpt-run", "hf-gpt"}
CLASSIFIERS = {"finetune-run", "classifier", "regression", "hf-classifier"}
TAGGERS = {"tagger"}
MODELS = BERTS | GPTS | CLASSIFIERS | TAGGERS
TOKENIZERS = {"tokenizer", "final", "hf-export", "import", "hf-gpt", "tagger"} | CLASSIFIERS - {
    "finetune-run"
}


def kind_path(trace: Trace, kind: str) -> Path:
    fixture = KINDS[kind]
    return trace.path("absent") if fixture is None else M.world[fixture]


# ------------------------------------------------------------------------------ case families


def cases() -> list[Case]:
    return [
        *input_cases(),
        *setting_cases(),
        *output_path_cases(),
        *kind_cases(),
        *resume_kind_cases(),
        *new_out_kind_cases(),
        *damage_cases(),
        *signal_cases(),
        *concurrency_cases(),
        *disk_cases(),
    ]


# -- bad bytes, formats, missing and empty inputs


def bad_file(trace: Trace, variant: str, suffix: str = ".txt") -> Path:
    """A corpus or text file of one bad kind, written in the case's folder."""
    path = trace.path(f"input-{variant}{suffix}")
    content = {
        "empty": b"",
        "blank-lines": b"\n\n   \n\t\n\n",
        "not-utf8": "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin-1") * 50,
        "binary": random.Random(0).randbytes(4096),
        "nul-bytes": b"the cat sat\x00 on the mat .\n" * 40,
        "one-line": b"the cat sat on the mat .\n",
    }
    if variant == "missing":
        return path
    if variant == "folder":
        path.mkdir()
        return path
    if variant == "no-match":
        return trace.path("nowhere") / "*.txt"
    if variant == "fake-gzip":
        path = trace.path("input.txt.gz")
        path.write_text("the cat sat on the mat .\n" * 100)
    elif variant == "torn-gzip":
        path = trace.path("input.txt.gz")
        whole = gzip.compress(data("train.tokens").read_bytes())
        path.write_bytes(whole[: len(whole) // 2])
    elif variant == "fake-parquet":
        path = trace.path("input.parquet")
        path.write_bytes(b"PAR1" + random.Random(1).randbytes(2000))
    elif variant == "bad-jsonl":
        path = trace.path("input.jsonl")
        path.write_text('{"text": "the cat sat on the mat ."}\n{"text": "unclosed\n' * 20)
    elif variant == "jsonl-no-text":
        path = trace.path("input.jsonl")
        path.write_text('{"body": "the cat sat on the mat ."}\n' * 40)
    else:
        path.write_bytes(content[variant])
    trace.note(f"# {shorten(str(path))}: {variant}")
    return path


CORPUS_VARIANTS = cmd(
    "missing empty blank-lines not-utf8 binary folder no-match fake-gzip torn-gzip fake-parquet bad-jsonl "
    "jsonl-no-text nul-bytes one-line"
)
MAYBE_FINE = {"nul-bytes", "one-line"}  # text a command may well accept


def corpus_uses(trace: Trace, corpus: Path) -> dict[str, tuple[list, Path | None]]:
    """Each command that reads a corpus: its arguments with `corpus`, and its output (or None)."""
    out = trace.path("out")
    return {
        "tokenizer": (["tokenizer", "train", "--corpus", corpus, "--vocab-size", "200", "--out", out], out),
        "prepare": (["prepare", "--corpus", corpus, "--tokenizer", M.world["tok"], "--out", out], out),
        "pretrain": (
            cmd(
                "pretrain --corpus {} --tokenizer {} --out {} {*} --max-steps 2",
                corpus,
                M.world["tok"],
                out,
                TINY,
            ),
            out,
        ),
        "pretrain-valid": (pretrain_argv(out, "--valid", corpus, "--max-steps", "2"), out),
        "evaluate": (["evaluate", "--model", M.world["bert"], "--corpus", corpus, "--quiet"], None),
        "showcase": (["showcase", "--model", M.world["bert"], "--corpus", corpus], None),
    }


def corpus_case(use: str, variant: str) -> Case:
    def body(trace: Trace) -> None:
        corpus = bad_file(trace, variant)
        argv, out = corpus_uses(trace, corpus)[use]
        result = trace.bf(*argv, env={"BERTFORGE_CACHE": str(trace.path("cache"))})
        if variant in MAYBE_FINE:
            if not either(result) and out is not None:
                absent(out)
            return
        refused(result)
        if out is not None:
            absent(out)
        no_leftovers(trace.path("cache"))

    expected = (EITHER if variant in MAYBE_FINE else REFUSED) + "; nothing written, nothing left in the cache"
    return Case(f"input/{use}-corpus-{variant}", expected, body)


TEXT_VARIANTS = ["missing", "empty", "blank-lines", "not-utf8", "binary", "folder"]


def text_case(command: str, variant: str) -> Case:
    def body(trace: Trace) -> None:
        path = bad_file(trace, variant)
        out = trace.path("vectors.npy")
        model = M.world[{"classify": "clf", "tag": "tagger"}.get(command, "bert")]
        extra = ["--out", out, "--quiet"] if command == "embed" else []
        result = trace.bf(command, "--model", model, "--input", path, *extra)
        if variant == "blank-lines":
            either(result)
        else:
            refused(result)
            absent(out)

    return Case(f"input/{command}-input-{variant}", (EITHER if variant == "blank-lines" else REFUSED), body)


def simple_case(
    name: str,
    expected: str,
    argv: Callable[[Trace], list],
    check: Callable[..., None],
    setup: Callable[[Trace], None] | None = None,
    words: tuple = (),
) -> Case:
    """A case of one command: `setup`, then `argv` (with $CASE folders made by the trace), then `check`."""

    def body(trace: Trace) -> None:
        if setup:
            setup(trace)
        result = trace.bf(*argv(trace))
        check(result, *words)
        out = trace.path("out")
        if check is refused:
            absent(out)

    return Case(name, expected, body)


def write(trace: Trace, name: str, text: str) -> Path:
    path = trace.path(name)
    path.write_text(text, encoding="utf-8")
    trace.note(f"printf {json.dumps(text[:120])} > {shorten(str(path))}")
    return path


def finetune_with(trace: Trace, train: Path | None = None, valid: Path | None = None, *extra) -> list:
    """`finetune_argv` of the tiny model into the case's out/, with other training or validation files."""
    argv = finetune_argv(M.world["bert"], trace.path("out"), *extra)
    if train:
        argv[argv.index("--train") + 1] = train
    if valid:
        argv[argv.index("--valid") + 1] = valid
    return argv


def finetune_data_case(name: str, rows: str, extra: tuple = (), expect=refused, words: tuple = ()) -> Case:
    def argv(trace: Trace) -> list:
        train = trace.path("train.csv")
        train.write_bytes(rows.encode("utf-8", "surrogateescape"))
        trace.note(f"printf {json.dumps(rows[:100])}... > {shorten(str(train))}")
        return finetune_with(trace, train, train if "--valid" not in extra else None, *extra)

    return simple_case(
        f"input/finetune-{name}", REFUSED if expect is refused else EITHER, argv, expect, words=words
    )


def ner_case(name: str, train: str | None, dev: str | None) -> Case:
    """`finetune --task ner` with a tagged training or dev file of these lines (None: the fixture's)."""

    def argv(trace: Trace) -> list:
        files = [
            write(trace, f"{name}-{i}.txt", text) if text is not None else data(default)
            for i, (text, default) in enumerate(((train, "conll-train.txt"), (dev, "conll-dev.txt")))
        ]
        template = "finetune --model {} --train {} --valid {} --out {} --task ner --max-length 32 --quiet"
        return cmd(template, M.world["bert"], *files, trace.path("out"))

    return simple_case(f"input/finetune-ner-{name}", REFUSED + " naming the file and line", argv, refused)


def glue_folder(trace: Trace, train: str | None, dev: str | None) -> Path:
    """A GLUE data folder with an RTE task of these files' texts (None: the file left out)."""
    root = trace.path("glue-data")
    (root / "RTE").mkdir(parents=True)
    for name, text in (("train.tsv", train), ("dev.tsv", dev)):
        if text is not None:
            (root / "RTE" / name).write_bytes(text.encode("utf-8", "surrogateescape"))
    trace.note(
        f"# {shorten(str(root))}/RTE: train.tsv {train and train[:60]!r}, dev.tsv {dev and dev[:60]!r}"
    )
    return root


RTE_HEADER = "index\tsentence1\tsentence2\tlabel\n"
RTE_ROWS = "".join(
    f"{i}\tthe cat sat number {i} .\tthe cat sat .\t{'entailment' if i % 2 else 'not_entailment'}\n"
    for i in range(40)
)


def glue_case(name: str, train: str | None, dev: str | None, extra: tuple = ()) -> Case:
    def argv(trace: Trace) -> list:
        return with_flag(glue_argv(trace.path("out"), *extra), "--data", glue_folder(trace, train, dev))

    return simple_case(f"input/glue-{name}", REFUSED + "; --out not written", argv, refused)


def input_cases() -> list[Case]:
    found = [
        corpus_case(use, variant)
        for use in ("tokenizer", "prepare", "pretrain", "pretrain-valid", "evaluate", "showcase")
        for variant in CORPUS_VARIANTS
    ]
    found += [
        text_case(c, v) for c in ("embed", "fill-mask", "nsp", "classify", "tag") for v in TEXT_VARIANTS
    ]
    good = "sentence,label\n" + "".join(f"a fine film number {i},{i % 2}\n" for i in range(40))
    found += [
        finetune_data_case("train-missing-column", good, ("--label-column", "stars"), words=("stars",)),
        finetune_data_case("train-header-only", "sentence,label\n"),
        finetune_data_case("train-empty", ""),
        finetune_data_case("train-one-class", "sentence,label\n" + "a film,1\n" * 40, expect=either),
        finetune_data_case("train-ragged-row", good + "only a text\n"),
        finetune_data_case("train-empty-label", good + "a film,\n", expect=either),
        finetune_data_case("train-not-utf8", "sentence,label\n" + "caf\udce9 film,1\nbad film,0\n" * 10),
        finetune_data_case(
            "regression-mixed-labels",
            "sentence,label\n" + "a film,0.5\n" * 20 + "a film,yes\n",
            ("--task", "regression"),
        ),
        finetune_data_case(
            "train-bad-jsonl",
            '{"sentence": "a film", "label": 1}\n{"sentence": \n' * 10,
            ("--format", "jsonl"),
        ),
        simple_case(
            "input/finetune-valid-unseen-label",
            EITHER,
            lambda t: finetune_with(t, None, write(t, "valid.csv", "sentence,label\n" + "a film,7\n" * 8)),
            either,
        ),
        ner_case("train-ragged-columns", "EU NNP B-ORG\nrejects O\n\n", None),
        ner_case("dev-unseen-tag", None, "Rome B-LOC\nis O\n\nAda B-PERSON\n"),
        ner_case("train-empty", "", None),
        simple_case(
            "input/finetune-train-missing", REFUSED, lambda t: finetune_with(t, t.path("none.csv")), refused
        ),
        simple_case(
            "input/glue-data-missing",
            REFUSED,
            lambda t: with_flag(glue_argv(t.path("out")), "--data", t.path("nowhere")),
            refused,
        ),
        glue_case("train-missing", None, RTE_HEADER + RTE_ROWS),
        glue_case("train-empty", "", RTE_HEADER + RTE_ROWS),
        glue_case(
            "train-damaged-row", RTE_HEADER + RTE_ROWS + "40\tonly one sentence\n", RTE_HEADER + RTE_ROWS
        ),
        glue_case("dev-header-only", RTE_HEADER + RTE_ROWS, RTE_HEADER),
        glue_case("dev-not-utf8", RTE_HEADER + RTE_ROWS, (RTE_HEADER + "0\tcaf\udce9\tx\tentailment\n")),
        simple_case(
            "input/glue-data-empty-folder",
            REFUSED,
            lambda t: with_flag(glue_argv(t.path("out")), "--data", M.world["empty"]),
            refused,
        ),
        simple_case(
            "input/glue-unknown-task",
            REFUSED,
            lambda t: [*glue_argv(t.path("out")), "--tasks", "squad"],
            refused,
            words=("squad",),
        ),
        simple_case(
            "input/glue-recipes-missing",
            REFUSED,
            lambda t: [*glue_argv(t.path("out")), "--recipes", t.path("none.toml")],
            refused,
        ),
        simple_case(
            "input/glue-recipes-not-toml",
            REFUSED,
            lambda t: [*glue_argv(t.path("out")), "--recipes", write(t, "r.toml", "[default\nx=")],
            refused,
        ),
        simple_case(
            "input/glue-recipes-unknown-key",
            REFUSED,
            lambda t: [*glue_argv(t.path("out")), "--recipes", write(t, "r.toml", "[default]\nepoch = 2\n")],
            refused,
            words=("epoch",),
        ),
        simple_case(
            "input/glue-recipes-zero-epochs",
            REFUSED,
            lambda t: [*glue_argv(t.path("out")), "--recipes", write(t, "r.toml", "[default]\nepochs = 0\n")],
            refused,
            words=("epochs",),
        ),
        simple_case(
            "input/glue-recipes-too-long",
            REFUSED,
            lambda t: [
                *glue_argv(t.path("out")),
                "--recipes",
                write(t, "r.toml", "[default]\nmax_length = 100\n"),
            ],
            refused,
        ),
        simple_case(
            "input/fill-mask-no-mask",
            REFUSED,
            lambda t: ["fill-mask", "--model", M.world["bert"], "the cat sat"],
            refused,
        ),
        simple_case(
            "input/fill-mask-too-long",
            REFUSED,
            lambda t: ["fill-mask", "--model", M.world["bert"], "word " * 200 + "[MASK]"],
            refused,
        ),
        simple_case(
            "input/fill-mask-empty-text",
            REFUSED,
            lambda t: ["fill-mask", "--model", M.world["bert"], ""],
            refused,
        ),
        simple_case(
            "input/nsp-one-sentence",
            REFUSED,
            lambda t: ["nsp", "--model", M.world["bert"], "only one"],
            refused,
        ),
        simple_case(
            "input/nsp-input-without-tab",
            REFUSED,
            lambda t: ["nsp", "--model", M.world["bert"], "--input", write(t, "p.tsv", "no tab here\n")],
            refused,
        ),
        simple_case(
            "input/fill-mask-input-without-mask",
            REFUSED,
            lambda t: ["fill-mask", "--model", M.world["bert"], "--input", write(t, "m.txt", "no mask\n")],
            refused,
        ),
        simple_case(
            "input/embed-one-long-line",
            OK + " (a warning: truncated)",
            lambda t: cmd(
                "embed --model {} --input {} --out {} --quiet",
                M.world["bert"],
                write(t, "l.txt", "word " * 3000),
                t.path("v.npy"),
            ),
            succeeded,
        ),
        simple_case(
            "input/generate-empty-prompt",
            EITHER,
            lambda t: ["generate", "--model", M.world["gpt"], "", "--max-new-tokens", "3"],
            either,
        ),
        simple_case(
            "input/classify-pair-to-single-text-model",
            EITHER,
            lambda t: ["classify", "--model", M.world["clf"], "a fine film\tand a pair"],
            either,
        ),
        simple_case(
            "input/classify-no-text", REFUSED, lambda t: ["classify", "--model", M.world["clf"]], refused
        ),
        simple_case(
            "input/plot-not-a-run",
            REFUSED,
            lambda t: ["plot", M.world["tok"], "--out", t.path("out.png")],
            refused,
        ),
        simple_case(
            "input/plot-missing-run",
            REFUSED,
            lambda t: ["plot", t.path("nope"), "--out", t.path("out.png")],
            refused,
        ),
        simple_case(
            "input/fetch-without-network",
            EITHER + " (one line naming the download)",
            lambda t: ["fetch", "wikitext-2", "--cache-dir", t.path("out"), "--quiet"],
            either,
        ),
        simple_case("input/import-hf-index-escaping-folder", REFUSED, import_escaping_index, refused),
        simple_case("input/import-hf-weights-symlinked-outside", REFUSED, import_symlinked_weights, refused),
        simple_case("input/import-hf-edited-vocab-size", REFUSED, import_edited_vocab, refused),
    ]
    return found


def import_escaping_index(trace: Trace) -> list:
    hf = trace.copy("hf")
    (hf / "model.safetensors").rename(trace.path("outside.safetensors"))
    names = list(tensors(trace.path("outside.safetensors")))
    index = {"metadata": {}, "weight_map": {name: "../outside.safetensors" for name in names}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    trace.note("mv hf/model.safetensors outside.safetensors; an index naming ../outside.safetensors")
    return ["import-hf", "--from", hf, "--out", trace.path("out")]


def import_symlinked_weights(trace: Trace) -> list:
    hf = trace.copy("hf")
    (hf / "model.safetensors").rename(trace.path("outside.safetensors"))
    (hf / "model.safetensors").symlink_to(trace.path("outside.safetensors"))
    trace.note(
        "mv hf/model.safetensors outside.safetensors; ln -s ../outside.safetensors hf/model.safetensors"
    )
    return ["import-hf", "--from", hf, "--out", trace.path("out")]


def import_edited_vocab(trace: Trace) -> list:
    hf = trace.copy("hf")
    config = json.loads((hf / "config.json").read_text())
    config["vocab_size"] = config["vocab_size"] + 500
    (hf / "config.json").write_text(json.dumps(config))
    trace.note("vocab_size += 500 in hf/config.json")
    return ["import-hf", "--from", hf, "--out", trace.path("out")]


# -- impossible settings and flags


# Impossible settings of `pretrain`: each must be refused before anything is written.
PRETRAIN_SETTINGS = {
    "lr-zero": "--lr 0",
    "lr-negative": "--lr -1",
    "lr-nan": "--lr nan",
    "lr-inf": "--lr inf",
    "max-steps-zero": "--max-steps 0",
    "max-steps-negative": "--max-steps -5",
    "max-minutes-negative": "--max-minutes -1",
    "batch-size-zero": "--set train.batch_size=0",
    "seed-negative": "--seed -1",
    "seed-huge": "--seed 99999999999999999999",
    "device-unknown": "--device quantum",
    "device-cuda-absent": "--device cuda:7",
    "adam-beta1-one": "--set train.adam_beta1=1.0",
    "adam-beta2-one": "--set train.adam_beta2=1.0",
    "adam-beta1-negative": "--set train.adam_beta1=-0.5",
    "adam-epsilon-negative": "--set train.adam_epsilon=-1e-6",
    "weight-decay-negative": "--set train.weight_decay=-0.1",
    "warmup-ratio-two": "--set train.warmup_ratio=2.0",
    "grad-norm-negative": "--set train.max_grad_norm=-1",
    "accumulation-zero": "--set train.gradient_accumulation_steps=0",
    "keep-checkpoints-zero": "--set train.keep_checkpoints=0",
    "checkpoint-every-negative": "--set train.checkpoint_every=-1",
    "log-every-zero": "--set train.log_every=0",
    "eval-every-zero": "--set train.eval_every=0",
    "mlm-probability-zero": "--set data.mlm_probability=0",
    "mlm-probability-above-one": "--set data.mlm_probability=1.5",
    "max-seq-length-one": "--set data.max_seq_length=1",
    "max-seq-length-above-positions": "--set data.max_seq_length=128",
    "heads-not-dividing": "--set model.num_attention_heads=3",
    "hidden-dropout-above-one": "--set model.hidden_dropout_prob=1.5",
    "layer-norm-eps-zero": "--set model.layer_norm_eps=0",
    "vocab-size-tiny": "--set tokenizer.vocab_size=3",
    "threads-negative": "--set runtime.threads=-5",
    "unknown-key": "--set train.learning_rat=1e-3",
    "unknown-section": "--set trian.lr=1",
    "set-without-value": "--set train.max_steps",
    "set-wrong-type": "--set 'train.max_steps=\"ten\"'",
    "set-bad-toml": "--set train.max_steps=1e",
    "schedule-unknown": "--set train.schedule=cosine",
    "precision-unknown": "--set runtime.precision=fp8",
    "dist-timeout-zero": "--set runtime.dist_timeout_minutes=0",
    "warmup-seq-above-max": "--set data.warmup_seq_length=100",
    "eval-max-pairs-negative": "--set data.eval_max_pairs=-1",
}
CONFIG_FILES = {  # name: the text of --config FILE (None: no such file)
    "config-missing": None,
    "config-not-toml": "[train\nlr = ",
    "config-unknown-section": "[trian]\nx = 1\n",
    "config-unknown-key": "[train]\nlearning_rat = 1e-3\n",
    "config-wrong-type": '[train]\nmax_steps = "ten"\n',
    "config-unknown-preset": 'preset = "huge"\n',
    "config-not-utf8": "[train]\n# caf\udce9\n",
}
ACCEPTABLE_FLAGS = {"generate-max-new-tokens-zero", "generate-seed-negative", "glue-tasks-empty"}
OTHER_FLAGS = {  # name: (the command of `base_argv`, the flags added)
    "finetune-epochs-zero": ("finetune", "--epochs 0"),
    "finetune-lr-negative": ("finetune", "--lr -1"),
    "finetune-batch-size-zero": ("finetune", "--batch-size 0"),
    "finetune-max-length-zero": ("finetune", "--max-length 0"),
    "finetune-max-length-above-positions": ("finetune", "--max-length 100000"),
    "finetune-dropout-above-one": ("finetune", "--dropout 1.5"),
    "finetune-seeds-not-numbers": ("finetune", "--seeds a,b"),
    "finetune-seeds-empty": ("finetune", "--seeds ''"),
    "finetune-adam-beta1-one": ("finetune", "--set train.adam_beta1=1.0"),
    "finetune-set-model-size": ("finetune", "--set model.hidden_size=64"),
    "fill-mask-top-k-zero": ("fill-mask", "--top-k 0"),
    "fill-mask-batch-size-zero": ("fill-mask", "--batch-size 0"),
    "nsp-batch-size-negative": ("nsp", "--batch-size -1"),
    "embed-batch-size-zero": ("embed", "--batch-size 0"),
    "classify-batch-size-zero": ("classify", "--batch-size 0"),
    "tag-batch-size-zero": ("tag", "--batch-size 0"),
    "generate-max-new-tokens-zero": ("generate", "--max-new-tokens 0"),
    "generate-max-new-tokens-negative": ("generate", "--max-new-tokens -3"),
    "generate-temperature-zero": ("generate", "--temperature 0"),
    "generate-temperature-nan": ("generate", "--temperature nan"),
    "generate-top-p-zero": ("generate", "--top-p 0"),
    "generate-top-p-above-one": ("generate", "--top-p 1.5"),
    "generate-top-k-negative": ("generate", "--top-k -1"),
    "generate-seed-negative": ("generate", "--seed -1"),
    "attention-layer-zero": ("attention", "--layers 0"),
    "attention-layer-nine": ("attention", "--layers 9"),
    "attention-layers-garbage": ("attention", "--layers a-b"),
    "attention-head-nine": ("attention", "--heads 9"),
    "attention-pair-on-gpt": ("attention-gpt", "--pair 'a second text'"),
    "evaluate-max-pairs-negative": ("evaluate", "--max-pairs -1"),
    "evaluate-max-length-one": ("evaluate", "--max-length 1"),
    "evaluate-max-length-above-positions": ("evaluate", "--max-length 100000"),
    "showcase-sentences-zero": ("showcase", "--sentences 0"),
    "tokenizer-vocab-size-three": ("tokenizer", "--vocab-size 3"),
    "tokenizer-vocab-size-negative": ("tokenizer", "--vocab-size -1"),
    "tokenizer-min-freq-zero": ("tokenizer", "--min-freq 0"),
    "glue-seeds-garbage": ("glue", "--seeds x"),
    "glue-tasks-empty": ("glue", "--tasks ''"),
}


def base_argv(trace: Trace, command: str) -> list:
    out = trace.path("out")
    bert, text = M.world["bert"], "the [MASK] was released ."
    return {
        "finetune": lambda: finetune_argv(bert, out),
        "fill-mask": lambda: ["fill-mask", "--model", bert, text],
        "nsp": lambda: ["nsp", "--model", bert, "The game sold well .", "It was ported ."],
        "embed": lambda: ["embed", "--model", bert, "--input", data("lines.txt"), "--out", out, "--quiet"],
        "classify": lambda: ["classify", "--model", M.world["clf"], "a fine film"],
        "tag": lambda: ["tag", "--model", M.world["tagger"], "Peter Blackburn went to Rome ."],
        "generate": lambda: ["generate", "--model", M.world["gpt"], "the album", "--max-new-tokens", "3"],
        "attention": lambda: cmd(
            "attention --model {} {} --out {}", bert, "the game sold well .", trace.path("a.png")
        ),
        "attention-gpt": lambda: cmd(
            "attention --model {} {} --out {}", M.world["gpt"], "the game", trace.path("a.png")
        ),
        "evaluate": lambda: ["evaluate", "--model", bert, "--corpus", data("valid.tokens"), "--quiet"],
        "showcase": lambda: ["showcase", "--model", bert, "--corpus", data("valid.tokens")],
        "tokenizer": lambda: ["tokenizer", "train", "--corpus", data("train.tokens"), "--out", out],
        "glue": lambda: glue_argv(out),
        "pretrain": lambda: pretrain_argv(out, "--max-steps", "2"),
    }[command]()


def setting_cases() -> list[Case]:
    found = [
        simple_case(
            f"settings/pretrain-{name}",
            REFUSED + "; --out not written",
            lambda t, flags=flags: [*base_argv(t, "pretrain"), *shlex.split(flags)],
            refused,
        )
        for name, flags in PRETRAIN_SETTINGS.items()
    ]
    for name, text in CONFIG_FILES.items():

        def argv(trace: Trace, text=text) -> list:
            config = trace.path("c.toml")
            if text is not None:
                config.write_bytes(text.encode("utf-8", "surrogateescape"))
                trace.note(f"printf {json.dumps(text)} > {shorten(str(config))}")
            return [*base_argv(trace, "pretrain"), "--config", config]

        found.append(simple_case(f"settings/pretrain-{name}", REFUSED + "; --out not written", argv, refused))
    found += [
        simple_case(
            f"settings/{name}",
            EITHER if name in ACCEPTABLE_FLAGS else REFUSED,
            lambda t, c=command, f=flags: [*base_argv(t, c), *shlex.split(f)],
            either if name in ACCEPTABLE_FLAGS else refused,
        )
        for name, (command, flags) in OTHER_FLAGS.items()
    ]
    return found


# -- an output path through a file


OUT_USERS = {
    "tokenizer": lambda t, o: ["tokenizer", "train", "--corpus", data("train.tokens"), "--out", o],
    "prepare": lambda t, o: cmd(
        "prepare --corpus {} --tokenizer {} --out {}", data("train.tokens"), M.world["tok"], o
    ),
    "pretrain": lambda t, o: pretrain_argv(o, "--max-steps", "2"),
    "finetune": lambda t, o: finetune_argv(M.world["bert"], o),
    "glue": lambda t, o: glue_argv(o),
    "export": lambda t, o: ["export", "--model", M.world["bert"], "--out", o],
    "import-hf": lambda t, o: ["import-hf", "--from", M.world["hf"], "--out", o],
    "embed": lambda t, o: cmd(
        "embed --model {} --input {} --out {} --quiet",
        M.world["bert"],
        data("lines.txt"),
        o.with_suffix(".npy"),
    ),
    "attention": lambda t, o: cmd(
        "attention --model {} {} --out {}", M.world["bert"], "a text", o.with_suffix(".png")
    ),
    "plot": lambda t, o: ["plot", M.world["bert"], "--out", o.with_suffix(".png")],
}


def output_path_cases() -> list[Case]:
    def make(command: str) -> Case:
        def body(trace: Trace) -> None:
            blocker = write(trace, "a-file", "in the way\n")
            result = trace.bf(*OUT_USERS[command](trace, blocker / "sub"))
            line = refused(result, "a-file")
            if not re.search(r"is a file|not a (folder|directory)", line):
                raise Fail(f"the line does not say that a-file is a file in the way: {line[:200]}")
            if blocker.read_text() != "in the way\n":
                raise Fail("a-file was changed")

        return Case(
            f"out-path/{command}-out-under-a-file", REFUSED + " saying a-file is a file in the way", body
        )

    return [make(command) for command in OUT_USERS]


# -- every folder kind given to every command


READERS: dict[str, tuple[Callable[[Trace, Path], list], set[str], set[str]]] = {
    # command: (arguments with the folder, kinds that must work, kinds that may work or be refused)
    "fill-mask": (
        lambda t, m: ["fill-mask", "--model", m, "the [MASK] was released ."],
        BERTS,
        {"hf-classifier"},
    ),
    "nsp": (
        lambda t, m: ["nsp", "--model", m, "The game sold well .", "It was ported ."],
        BERTS,
        {"hf-classifier"},
    ),
    "evaluate": (
        lambda t, m: cmd("evaluate --model {} --corpus {} --max-pairs 16 --quiet", m, data("valid.tokens")),
        BERTS | GPTS,
        {"hf-classifier"},
    ),
    "embed": (
        lambda t, m: cmd(
            "embed --model {} --input {} --out {} --quiet", m, data("lines.txt"), t.path("out.npy")
        ),
        BERTS,
        GPTS | CLASSIFIERS,
    ),
    "showcase": (
        lambda t, m: ["showcase", "--model", m, "--corpus", data("valid.tokens"), "--sentences", "2"],
        BERTS,
        {"hf-classifier"},
    ),
    "attention": (
        lambda t, m: ["attention", "--model", m, "the game sold well .", "--out", t.path("out.png")],
        MODELS,  # fine-tuned classifiers and taggers too
        set(),
    ),
    "generate": (
        lambda t, m: ["generate", "--model", m, "the album", "--max-new-tokens", "3", "--greedy"],
        GPTS,
        set(),
    ),
    "export": (
        lambda t, m: ["export", "--model", m, "--out", t.path("out")],
        (BERTS | CLASSIFIERS | TAGGERS | {"gpt-run"}) - {"hf-export", "hf-classifier"},
        {"hf-export", "hf-classifier", "hf-gpt"},
    ),
    "import-hf": (
        lambda t, m: ["import-hf", "--from", m, "--out", t.path("out")],
        {"hf-export", "hf-gpt"},
        {"hf-classifier"},
    ),
    "classify": (lambda t, m: ["classify", "--model", m, "a fine film"], CLASSIFIERS, set()),
    "tag": (lambda t, m: ["tag", "--model", m, "Peter Blackburn went to Rome ."], TAGGERS, set()),
    "finetune": (  # a tagger's encoder starts a classifier, with a fresh pooler
        lambda t, m: finetune_argv(m, t.path("out")),
        BERTS | {"gpt-run", "tagger"},
        CLASSIFIERS | {"hf-gpt"},
    ),
    "pretrain-init": (
        lambda t, m: cmd(
            "pretrain --init {} --corpus {} --out {} --max-steps 2 --quiet --set runtime.precision=fp32 "
            "--set data.max_seq_length=64",
            m,
            data("train.tokens"),
            t.path("out"),
        ),
        BERTS,
        GPTS | CLASSIFIERS,
    ),
    "pretrain-tokenizer": (
        lambda t, m: pretrain_argv(t.path("out"), "--max-steps", "2", "--tokenizer", m),
        {"tokenizer"},
        TOKENIZERS | {"pretraining-run", "gpt-run", "finetune-run"},
    ),
    "prepare-tokenizer": (
        lambda t, m: ["prepare", "--corpus", data("valid.tokens"), "--tokenizer", m, "--out", t.path("out")],
        {"tokenizer"},
        TOKENIZERS | {"pretraining-run", "gpt-run", "finetune-run"},
    ),
    "pretrain-shards": (
        lambda t, m: cmd(
            "pretrain --shards {} --tokenizer {} --out {} {*} --max-steps 2",
            m,
            M.world["tok"],
            t.path("out"),
            TINY,
        ),
        {"shards"},
        set(),
    ),
    "plot": (
        lambda t, m: ["plot", m, "--out", t.path("out.png")],
        {"pretraining-run"},
        (MODELS | {"glue-folder"}) - {"pretraining-run"},  # the GPT-1 run has no held-out metrics
    ),
    "glue": (lambda t, m: [*glue_argv(t.path("out")), "--model", m], {"checkpoint"}, GPTS | {"classifier"}),
}
# Commands that train get the folders that cannot work and a few that can (each run costs seconds).
NOT_MODELS = {"missing", "file", "empty-folder", "tokenizer", "shards", "glue-folder"}
TRAINING_KINDS = {
    "finetune": NOT_MODELS | {"checkpoint", "hf-export", "gpt-run", "classifier", "tagger"},
    "pretrain-init": NOT_MODELS | {"final", "hf-export", "gpt-run", "classifier"},
    "pretrain-tokenizer": NOT_MODELS | {"checkpoint", "final", "hf-export", "finetune-run"},
    "glue": NOT_MODELS | {"checkpoint", "classifier", "gpt-run", "hf-gpt"},
}


def kind_case(command: str, kind: str) -> Case:
    argv, works, may = READERS[command]
    expected = OK if kind in works else EITHER if kind in may else REFUSED + " naming the folder"
    expected += "; the folder given unchanged"

    def body(trace: Trace) -> None:
        folder = kind_path(trace, kind)
        before = snapshot(folder)
        result = trace.bf(*argv(trace, folder))
        if kind in works:
            succeeded(result)
        elif kind in may:
            either(result)
        else:
            refused(result, folder.name)
            absent(trace.path("out"))
        unchanged(folder, before)

    return Case(f"kinds/{command}-given-{kind}", expected, body)


def kind_cases() -> list[Case]:
    return [
        kind_case(command, kind)
        for command in READERS
        for kind in KINDS
        if kind in TRAINING_KINDS.get(command, KINDS)
    ]


# -- --resume and --out on a folder of another kind


RESUMERS: dict[str, tuple[Callable[[Path], list], str]] = {
    "pretrain": (lambda out: ["pretrain", "--out", out, "--resume", "--quiet"], "pretraining-run"),
    "finetune": (lambda out: ["finetune", "--out", out, "--resume", "--quiet"], "finetune-run"),
    "glue": (lambda out: ["glue", "--out", out, "--resume", "--quiet"], "glue-folder"),
}


def resume_kind_case(command: str, kind: str) -> Case:
    argv, own = RESUMERS[command]
    expected = (
        EITHER
        if kind == own or (command == "pretrain" and kind == "gpt-run")
        else REFUSED + " naming the folder; nothing in it changed"
    )

    def body(trace: Trace) -> None:
        folder = trace.copy(KINDS[kind], "folder") if KINDS[kind] else trace.path("absent")
        before = snapshot(folder)
        result = trace.bf(*argv(folder))
        if kind == own or (command == "pretrain" and kind == "gpt-run"):
            if either(result):
                final = folder / "final" / "model.safetensors"
                if command == "pretrain" and tensors(final) != tensors(
                    M.world[KINDS[kind]] / "final" / "model.safetensors"
                ):
                    raise Fail("--resume of a finished run replaced its final model")
            return
        refused(result, "folder" if kind != "missing" else "absent")
        unchanged(folder, before)

    return Case(f"resume/{command}-resume-on-{kind}", expected, body)


def resume_kind_cases() -> list[Case]:
    return [resume_kind_case(command, kind) for command in RESUMERS for kind in KINDS]


NEW_OUT_KINDS = cmd("pretraining-run checkpoint finetune-run glue-folder hf-export tokenizer shards")


def new_out_case(command: str, kind: str) -> Case:
    may = command == "glue" and kind == "glue-folder"  # rerunning glue on its folder continues it

    def body(trace: Trace) -> None:
        folder = trace.copy(KINDS[kind], "folder")
        before = snapshot(folder)
        result = trace.bf(*OUT_USERS[command](trace, folder))
        if may:
            either(result)
            return
        refused(result, "folder")
        unchanged(folder, before)

    expected = EITHER if may else REFUSED + " naming the folder; nothing in it changed"
    return Case(f"out-kind/{command}-out-on-{kind}", expected, body)


def new_out_kind_cases() -> list[Case]:
    users = [c for c in OUT_USERS if c not in ("embed", "attention", "plot")]
    return [new_out_case(command, kind) for command in users for kind in NEW_OUT_KINDS]


# -- damaged files of each folder kind


def truncate(path: Path, trace: Trace, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))
    trace.note(f"truncate -s {int(keep * 100)}% {shorten(str(path))}")


def flip(path: Path, trace: Trace, at: float = 0.5, count: int = 16) -> None:
    blob = bytearray(path.read_bytes())
    start = int(len(blob) * at)
    blob[start : start + count] = bytes(255 - b for b in blob[start : start + count])
    path.write_bytes(bytes(blob))
    trace.note(f"flip {count} bytes at {int(at * 100)}% of {shorten(str(path))}")


def garble(path: Path, trace: Trace) -> None:
    path.write_text("{not json", encoding="utf-8")
    trace.note(f"printf '{{not json' > {shorten(str(path))}")


def delete(path: Path, trace: Trace) -> None:
    (shutil.rmtree if path.is_dir() else os.unlink)(path)
    trace.note(f"rm -r {shorten(str(path))}")


def edit_state(path: Path, trace: Trace) -> None:
    text = path.read_text()
    match = re.search(r'"(\w+)": (\d+)', text.split('"sha256"')[0])
    if not match:
        raise Skip(f"no number in {path}")
    key, value = match.groups()
    path.write_text(text.replace(match.group(0), f'"{key}": {int(value) + 200}', 1))
    trace.note(f'{shorten(str(path))}: "{key}": {value} -> {int(value) + 200}')


def unfinished(trace: Trace, fixture: str = "ref-bert") -> Path:
    """A copy of a finished run as if stopped after its last checkpoint (no final/, no loss.png)."""
    run = trace.copy(fixture, "run")
    for name in ("final", "loss.png"):
        if (run / name).exists():
            delete(run / name, trace)
    return run


def newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step_*"))[-1]


def resume_to_reference(trace: Trace, run: Path, warned: bool) -> None:
    """`pretrain --resume` of a damaged copy of ref-bert must end as ref-bert (with a warning when the
    damaged checkpoint was set aside)."""
    result = trace.bf("pretrain", "--out", run, "--resume", "--quiet")
    succeeded(result)
    if warned and not any(line.startswith("bertforge: warning:") for line in result.lines):
        raise Fail("resumed from a damaged checkpoint without a warning")
    same_run(run, M.world["ref-bert"])


def damage_resume_case(name: str, damage: Callable[[Trace, Path], None], warned: bool) -> Case:
    def body(trace: Trace) -> None:
        run = unfinished(trace)
        damage(trace, run)
        resume_to_reference(trace, run, warned)

    return Case(
        f"damage/{name}",
        "a warning, then the run resumes and ends bit-identical to the uninterrupted one"
        if warned
        else OK + "; the resumed run ends bit-identical to the uninterrupted one",
        body,
    )


def damage_refused_case(
    name: str,
    damage: Callable[[Trace, Path], None],
    argv: Callable[[Trace, Path], list],
    fixture: str = "bert",
    words: tuple = (),
) -> Case:
    def body(trace: Trace) -> None:
        folder = trace.copy(fixture, "folder")
        damage(trace, folder)
        before = snapshot(folder)
        result = trace.bf(*argv(trace, folder))
        refused(result, *words)
        unchanged(folder, before)

    return Case(f"damage/{name}", REFUSED + " naming the damaged file; nothing changed", body)


def damage_either_case(name: str, damage, argv, fixture: str = "bert") -> Case:
    def body(trace: Trace) -> None:
        folder = trace.copy(fixture, "folder")
        damage(trace, folder)
        either(trace.bf(*argv(trace, folder)))

    return Case(f"damage/{name}", EITHER, body)


def fill_mask(trace: Trace, model: Path) -> list:
    return ["fill-mask", "--model", model, "the [MASK] was released ."]


def classify(trace: Trace, model: Path) -> list:
    return ["classify", "--model", model, "a fine film"]


def resume(trace: Trace, run: Path) -> list:
    return ["pretrain", "--out", run, "--resume", "--quiet"]


def damage_cases() -> list[Case]:
    ck = newest
    found = [
        damage_resume_case(
            "checkpoint-weights-flipped", lambda t, r: flip(ck(r) / "model.safetensors", t), True
        ),
        damage_resume_case(
            "checkpoint-weights-truncated", lambda t, r: truncate(ck(r) / "model.safetensors", t), True
        ),
        damage_resume_case(
            "checkpoint-optimizer-truncated", lambda t, r: truncate(ck(r) / "optimizer.pt", t), True
        ),
        damage_resume_case(
            "checkpoint-optimizer-flipped", lambda t, r: flip(ck(r) / "optimizer.pt", t, 0.9), True
        ),
        damage_resume_case(
            "checkpoint-state-number-edited", lambda t, r: edit_state(ck(r) / "state.json", t), True
        ),
        damage_resume_case("checkpoint-state-not-json", lambda t, r: garble(ck(r) / "state.json", t), True),
        damage_resume_case("checkpoint-state-missing", lambda t, r: delete(ck(r) / "state.json", t), True),
        damage_resume_case("checkpoint-config-not-json", lambda t, r: garble(ck(r) / "config.json", t), True),
        damage_resume_case(
            "checkpoint-weights-missing", lambda t, r: delete(ck(r) / "model.safetensors", t), True
        ),
        damage_resume_case("metrics-last-line-torn", lambda t, r: torn_metrics(t, r), False),
        damage_resume_case("stale-lock-file", lambda t, r: stale_lock(t, r), False),
        damage_resume_case("checkpoint-write-leftovers", lambda t, r: leftovers(t, r), False),
        damage_refused_case(
            "all-checkpoints-damaged",
            lambda t, r: (
                [truncate(c / "model.safetensors", t) for c in sorted((r / "checkpoints").glob("step_*"))]
                and delete(r / "final", t)
            ),
            resume,
            words=("intact",),
        ),
        damage_refused_case(
            "metrics-middle-line-damaged",
            lambda t, r: damage_metrics_middle(t, r) or delete(r / "final", t),
            resume,
            words=("metrics.jsonl",),
        ),
        damage_refused_case(
            "data-json-not-json",
            lambda t, r: garble(r / "data.json", t) or delete(r / "final", t),
            resume,
            words=("data.json",),
        ),
        damage_refused_case(
            "run-config-not-json",
            lambda t, r: garble(r / "config.json", t) or delete(r / "final", t),
            resume,
            words=("config.json",),
        ),
        damage_refused_case(
            "run-config-missing", lambda t, r: delete(r / "config.json", t) or delete(r / "final", t), resume
        ),
        damage_refused_case(
            "run-tokenizer-missing",
            lambda t, r: delete(r / "tokenizer", t) or delete(r / "final", t),
            resume,
            words=("tokenizer",),
        ),
        corpus_changed_case(),
        finished_without_checkpoints_case(),
        damage_refused_case(
            "final-weights-truncated",
            lambda t, r: truncate(r / "final" / "model.safetensors", t),
            fill_mask,
            words=("model.safetensors",),
        ),
        damage_refused_case(
            "final-weights-header",
            lambda t, r: flip(r / "final" / "model.safetensors", t, 0.0, 8),
            fill_mask,
            words=("model.safetensors",),
        ),
        damage_refused_case(
            "final-config-not-json",
            lambda t, r: garble(r / "final" / "config.json", t),
            fill_mask,
            words=("config.json",),
        ),
        damage_refused_case(
            "final-config-missing",
            lambda t, r: delete(r / "final" / "config.json", t),
            lambda t, r: fill_mask(t, r / "final"),
            words=("config.json",),
        ),
        damage_refused_case(
            "final-config-edited-size",
            lambda t, r: edit_json(r / "final" / "config.json", t, ("model", "hidden_size"), 48),
            fill_mask,
        ),
        damage_refused_case(
            "final-tokenizer-not-json",
            lambda t, r: garble(r / "final" / "tokenizer.json", t),
            fill_mask,
            words=("tokenizer.json",),
        ),
        damage_either_case(
            "final-vocab-missing", lambda t, r: delete(r / "final" / "vocab.txt", t), fill_mask
        ),
        damage_refused_case(
            "final-tokenizer-files-missing",
            lambda t, r: [delete(r / "final" / n, t) for n in ("vocab.txt", "tokenizer.json")],
            fill_mask,
        ),
        damage_refused_case(
            "checkpoint-weights-flipped-read",
            lambda t, r: flip(newest(r) / "model.safetensors", t),
            lambda t, r: fill_mask(t, newest(r)),
            words=("model.safetensors",),
        ),
        damage_refused_case(
            "checkpoint-without-run-tokenizer",
            lambda t, r: delete(r / "tokenizer", t),
            lambda t, r: fill_mask(t, newest(r)),
            words=("tokenizer",),
        ),
        damage_refused_case(
            "finetune-json-not-json",
            lambda t, r: garble(r / "finetune.json", t),
            lambda t, r: ["finetune", "--out", r, "--resume", "--quiet"],
            "clf",
            words=("finetune.json",),
        ),
        damage_refused_case(
            "classifier-labels-not-json",
            lambda t, r: garble(r / "final" / "labels.json", t),
            classify,
            "clf",
            words=("labels.json",),
        ),
        damage_refused_case(
            "classifier-weights-truncated",
            lambda t, r: truncate(r / "final" / "model.safetensors", t),
            classify,
            "clf",
            words=("model.safetensors",),
        ),
        damage_refused_case(
            "classifier-labels-missing", lambda t, r: delete(r / "final" / "labels.json", t), classify, "clf"
        ),
        damage_refused_case(
            "tagger-labels-not-json",
            lambda t, r: garble(r / "final" / "labels.json", t),
            lambda t, r: ["tag", "--model", r, "Peter went to Rome ."],
            "tagger",
            words=("labels.json",),
        ),
        damage_either_case(
            "glue-json-not-json",
            lambda t, r: garble(r / "glue.json", t),
            lambda t, r: ["glue", "--out", r, "--resume", "--quiet"],
            "glue",
        ),
        damage_either_case(
            "glue-seed-result-not-json",
            lambda t, r: garble(r / "RTE" / "seed_1" / "result.json", t),
            lambda t, r: ["glue", "--out", r, "--resume", "--quiet"],
            "glue",
        ),
        damage_refused_case(
            "glue-task-json-not-json",
            lambda t, r: garble(r / "glue_task.json", t),
            lambda t, r: ["glue", "--out", r, "--resume", "--quiet"],
            "glue",
            words=("glue_task.json",),
        ),
        damage_refused_case(
            "hf-config-not-json",
            lambda t, r: garble(r / "config.json", t),
            fill_mask,
            "hf",
            words=("config.json",),
        ),
        damage_refused_case(
            "hf-weights-truncated",
            lambda t, r: truncate(r / "model.safetensors", t),
            lambda t, r: ["import-hf", "--from", r, "--out", t.path("out")],
            "hf",
            words=("model.safetensors",),
        ),
        damage_refused_case(
            "hf-tokenizer-files-missing",
            lambda t, r: [delete(r / n, t) for n in ("vocab.txt", "tokenizer.json")],
            fill_mask,
            "hf",
        ),
        damage_refused_case(
            "hf-config-model-type-unknown",
            lambda t, r: edit_json(r / "config.json", t, ("model_type",), "roberta"),
            fill_mask,
            "hf",
            words=("roberta",),
        ),
        damage_refused_case(
            "shards-tokens-truncated",
            lambda t, r: truncate(biggest(r), t),
            lambda t, r: cmd(
                "pretrain --shards {} --tokenizer {} --out {} {*} --max-steps 2",
                r,
                M.world["tok"],
                t.path("out"),
                TINY,
            ),
            "shards",
        ),
        damage_refused_case(
            "shards-meta-not-json",
            lambda t, r: [garble(p, t) for p in r.glob("*.json")],
            lambda t, r: cmd(
                "pretrain --shards {} --tokenizer {} --out {} {*} --max-steps 2",
                r,
                M.world["tok"],
                t.path("out"),
                TINY,
            ),
            "shards",
        ),
        damage_refused_case(
            "tokenizer-json-not-json",
            lambda t, r: garble(r / "tokenizer.json", t),
            lambda t, r: cmd(
                "prepare --corpus {} --tokenizer {} --out {}", data("valid.tokens"), r, t.path("out")
            ),
            "tok",
            words=("tokenizer.json",),
        ),
        damage_either_case(
            "tokenizer-settings-missing",
            lambda t, r: delete(r / "bertforge_tokenizer.json", t),
            lambda t, r: cmd(
                "prepare --corpus {} --tokenizer {} --out {}", data("valid.tokens"), r, t.path("out")
            ),
            "tok",
        ),
        damage_refused_case(
            "gpt-final-weights-truncated",
            lambda t, r: truncate(r / "final" / "model.safetensors", t),
            lambda t, r: ["generate", "--model", r, "the album", "--max-new-tokens", "3"],
            "gpt",
            words=("model.safetensors",),
        ),
        cache_damage_case("cache-tokens-truncated", lambda t, entry: truncate(biggest(entry), t)),
        cache_damage_case("cache-tokens-flipped", lambda t, entry: flip(biggest(entry), t, 0.3, 64)),
        cache_damage_case(
            "cache-meta-not-json", lambda t, entry: [garble(p, t) for p in entry.glob("*.json")]
        ),
    ]
    return found


def biggest(folder: Path) -> Path:
    return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def edit_json(path: Path, trace: Trace, keys: tuple, value) -> None:
    config = json.loads(path.read_text())
    inner = config
    for key in keys[:-1]:
        inner = inner[key]
    inner[keys[-1]] = value
    path.write_text(json.dumps(config))
    trace.note(f"{shorten(str(path))}: {'.'.join(keys)} = {value!r}")


def torn_metrics(trace: Trace, run: Path) -> None:
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 121, "split": "tr')
    trace.note('printf \'{"step": 121, "split": "tr\' >> run/metrics.jsonl')


def damage_metrics_middle(trace: Trace, run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[len(lines) // 2] = "NOT JSON\n"
    (run / "metrics.jsonl").write_text("".join(lines))
    trace.note("a middle line of metrics.jsonl replaced by NOT JSON")


def stale_lock(trace: Trace, run: Path) -> None:
    (run / ".lock").write_text("999999\n")
    trace.note("echo 999999 > run/.lock")


def leftovers(trace: Trace, run: Path) -> None:
    (run / "checkpoints" / ".step_000130.tmp-abc123").mkdir()
    (run / ".metrics.jsonl.tmp-xyz789").write_text("half")
    (run / "checkpoints" / ".step_000010.del-qq11").mkdir()
    trace.note(
        "mkdir run/checkpoints/.step_000130.tmp-abc123 run/checkpoints/.step_000010.del-qq11; "
        "echo half > run/.metrics.jsonl.tmp-xyz789"
    )

    def swept() -> None:
        no_leftovers(run)

    trace.after = swept  # checked once the resume ran


def corpus_changed_case() -> Case:
    def body(trace: Trace) -> None:
        corpus = trace.path("corpus.tokens")
        shutil.copy2(data("train.tokens"), corpus)
        run = trace.path("run")
        argv = ["pretrain", "--corpus", corpus, "--tokenizer", M.world["tok"], "--out", run, *TINY]
        succeeded(trace.bf(*argv, "--max-steps", "4", "--set", "train.checkpoint_every=2"))
        delete(run / "final", trace)
        with corpus.open("a") as handle:
            handle.write(" = = New = = \n more text here .\n")
        trace.note("echo more text >> corpus.tokens")
        before = snapshot(run)
        refused(trace.bf("pretrain", "--out", run, "--resume", "--quiet"), "corpus.tokens")
        unchanged(run, before)
        succeeded(trace.bf("pretrain", "--out", run, "--resume", "--allow-changed-data", "--quiet"))

    return Case(
        "damage/corpus-changed-before-resume",
        REFUSED + " naming the changed file; --allow-changed-data then trains",
        body,
    )


def finished_without_checkpoints_case() -> Case:
    def body(trace: Trace) -> None:
        run = trace.copy("ref-bert", "run")
        delete(run / "checkpoints", trace)
        final = tensors(run / "final" / "model.safetensors")
        lines = len((run / "metrics.jsonl").read_text().splitlines())
        result = trace.bf("pretrain", "--out", run, "--resume", "--max-steps", "20", "--quiet")
        either(result)
        if tensors(run / "final" / "model.safetensors") != final:
            raise Fail(f"the finished model was replaced ({result.describe()})")
        if len((run / "metrics.jsonl").read_text().splitlines()) < lines:
            raise Fail("metrics.jsonl lost lines")

    return Case(
        "damage/finished-run-without-checkpoints-resumed", EITHER + "; final/ and metrics.jsonl kept", body
    )


def cache_damage_case(name: str, damage: Callable[[Trace, Path], None]) -> Case:
    def body(trace: Trace) -> None:
        cache = trace.path("cache")
        env = {"BERTFORGE_CACHE": str(cache)}
        argv = pretrain_argv(trace.path("run"), "--max-steps", "2", corpus="valid.tokens")
        succeeded(trace.bf(*argv, env=env))
        entries = [
            p.parent for p in cache.rglob("*") if p.is_file() and p.suffix in (".npy", ".bin", ".u16", ".u32")
        ]
        entries = entries or [biggest(cache).parent]
        damage(trace, entries[0])
        shutil.rmtree(trace.path("run"))
        result = trace.bf(*argv, env=env)
        if not either(result, "cache"):
            return
        if not (trace.path("run") / "final").is_dir():
            raise Fail("exit 0 without a final model")

    return Case(
        f"damage/{name}", "the damaged entry named in one error line (delete it) or rebuilt; never used", body
    )


# -- signals at random moments


def signal_cases() -> list[Case]:
    return [
        pretrain_signal_case("pretrain-sigterm", signal.SIGTERM),
        pretrain_signal_case("pretrain-sigint", signal.SIGINT),
        pretrain_signal_case("pretrain-sigint-twice", signal.SIGINT, twice=True),
        pretrain_signal_case(
            "pretrain-sigint-again-in-the-stop-checkpoint", signal.SIGINT, twice=True, in_write=True
        ),
        pretrain_signal_case("gpt-pretrain-sigterm", signal.SIGTERM, objective="clm"),
        *(pretrain_kill_case(f"pretrain-sigkill-{n}") for n in (1, 2, 3)),
        pretrain_kill_case("pretrain-sigkill-in-checkpoint-write", in_write=True),
        pretrain_kill_case("pretrain-sigkill-twice", twice=True),
        early_signal_case(signal.SIGINT),
        early_signal_case(signal.SIGTERM),
        finetune_signal_case(signal.SIGTERM),
        finetune_signal_case(signal.SIGKILL),
        glue_signal_case(signal.SIGTERM),
        glue_signal_case(signal.SIGKILL),
        prepare_signal_case(signal.SIGKILL),
        prepare_signal_case(signal.SIGINT),
        short_command_signal_case("tokenizer-train", signal.SIGINT),
        short_command_signal_case("embed", signal.SIGINT),
        short_command_signal_case("evaluate", signal.SIGINT),
        short_command_signal_case("embed", signal.SIGTERM),
    ]


def stopped(result: Result, signum: int) -> bool:
    """Ended by `signum`: exit 128 + its number, or (before bertforge set its handlers, as for any
    program) killed by it, which a shell reports the same; no traceback."""
    return result.code in (128 + signum, -signum) and "Traceback" not in result.err


def notices(result: Result) -> list[str]:
    """The lines on stderr other than progress lines."""
    return [line for line in result.lines if not progress([line])]


def steps_done(run: Path) -> int:
    return len(train_lines(run))


def steps_of_the_resume(run: Path) -> Callable[[], int]:
    """The steps logged by a resume of `run` about to start: 0 until it writes the log anew (cut back
    to the last checkpoint, or removed to start afresh), then the new log's steps, not the old one's."""
    path = run / "metrics.jsonl"

    def signature() -> tuple[int, int, int] | None:
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            return stat.st_ino, stat.st_size, stat.st_mtime_ns
        return None

    before, replaced = signature(), False

    def logged() -> int:
        nonlocal replaced
        replaced = replaced or signature() != before
        return steps_done(run) if replaced else 0

    return logged


def checkpoint_being_written(run: Path) -> Callable[[], bool]:
    folder = run / "checkpoints"

    def writing() -> bool:
        with contextlib.suppress(OSError):
            return any(LEFTOVER.match(entry.name) for entry in os.scandir(folder))
        return False

    return writing


def pretrain_signal_case(
    name: str, signum: int, twice: bool = False, objective: str = "mlm", in_write: bool = False
) -> Case:
    reference = "ref-gpt" if objective == "clm" else "ref-bert"
    code = 128 + signum

    def body(trace: Trace) -> None:
        run = trace.path("run")
        extra = GPT if objective == "clm" else []
        argv = pretrain_argv(run, *extra, *STEADY, "--max-steps", str(STEADY_STEPS))
        proc = trace.start(*argv)
        target = trace.rng.randint(2, STEADY_STEPS - 30)
        trace.note(
            f"# {signal.Signals(signum).name} once {target} steps are logged" + (", twice" if twice else "")
        )
        if not wait_until(lambda: steps_done(run) >= target, proc):
            raise Skip("the run ended before the signal")
        proc.send(signum, group=signum == signal.SIGINT)
        if in_write:
            trace.note("# the second SIGINT while the stop's checkpoint is being written")
            if not wait_until(checkpoint_being_written(run), proc, tick=0.0005):
                raise Skip("the stop's checkpoint write could not be caught")
            proc.send(signum, group=True)
        elif twice:
            time.sleep(0.05)
            proc.send(signum, group=True)
        result = proc.wait(60)
        problem = ""
        if result.code != code and not (twice and result.code == -signum):  # the second may kill it
            problem = f"expected exit {code}, got {result.describe()}"
        elif "Traceback" in result.err:
            problem = f"a traceback ({result.describe()})"
        if problem and not twice:
            raise Fail(problem)
        if "continue with" in result.err and not problem:
            resumed = [*continue_command(result), "--quiet"]
        elif "run the same command again" in result.err:  # no checkpoint was complete: nothing kept
            resumed = argv
        else:
            resumed = ["pretrain", "--out", str(run), "--resume", "--quiet"]
        succeeded(trace.bf(*resumed))
        same_run(run, M.world[reference])
        if problem:
            raise Fail(f"{problem}; `--resume` then ends bit-identical to the uninterrupted run")

    return Case(
        f"signals/{name}",
        f"exit {code}, one line naming the saved step and the command that continues; "
        "that command ends bit-identical to the uninterrupted run",
        body,
    )


def pretrain_kill_case(name: str, in_write: bool = False, twice: bool = False) -> Case:
    def body(trace: Trace) -> None:
        run = trace.path("run")
        argv = pretrain_argv(run, *STEADY, "--max-steps", str(STEADY_STEPS))
        for attempt in range(2 if twice else 1):
            logged = (lambda: steps_done(run)) if attempt == 0 else steps_of_the_resume(run)
            proc = trace.start(*(argv if attempt == 0 else ["pretrain", "--out", run, "--resume", "--quiet"]))
            kill_at_random(trace, proc, run, in_write, logged)
        succeeded(trace.bf("pretrain", "--out", run, "--resume", "--quiet"))
        same_run(run, M.world["ref-bert"])
        no_leftovers(run)

    what = (
        "inside a checkpoint write"
        if in_write
        else "at a random step" + (", then again in the resume" if twice else "")
    )
    return Case(
        f"signals/{name}",
        f"kill -9 {what}; `--resume` ends bit-identical to the uninterrupted run, no leftovers",
        body,
    )


def kill_at_random(trace: Trace, proc: Proc, run: Path, in_write: bool, logged: Callable[[], int]) -> None:
    """kill -9 inside a checkpoint write, or once `logged()` steps reach a random number."""
    if in_write:
        trace.note("# kill -9 while a checkpoint is being written (a .step_*.tmp-* folder exists)")
        if not wait_until(checkpoint_being_written(run), proc, tick=0.001):
            raise Skip("the run ended before a checkpoint write could be caught")
    else:
        target = trace.rng.randint(2, STEADY_STEPS - 20)
        trace.note(f"# kill -9 once {target} steps are logged")
        if not wait_until(lambda: logged() >= target, proc):
            raise Skip("the run ended before the kill")
    proc.send(signal.SIGKILL, group=True)
    proc.wait(30)


def early_signal_case(signum: int) -> Case:
    code = 128 + signum

    def body(trace: Trace) -> None:
        run = trace.path("run")
        env = {"BERTFORGE_CACHE": str(trace.path("cache"))}  # a cold cache: the tokenizer is trained first
        argv = ["pretrain", "--corpus", data("train.tokens"), "--out", run, *TINY, "--max-steps", "3"]
        proc = trace.start(*argv, env=env)
        delay = trace.rng.uniform(0.2, 0.8)
        trace.note(
            f"# {signal.Signals(signum).name} {delay:.2f} s after the start, while the tokenizer trains"
        )
        time.sleep(delay)
        if (run / "config.json").exists() or proc.poll() is not None:
            raise Skip("the run folder existed before the signal")
        proc.send(signum, group=True)
        result = proc.wait(60)
        if not stopped(result, signum) or len(notices(result)) > 1:
            raise Fail(f"expected exit {code} and at most one line, got {result.describe()}")
        if "--resume" in result.err and not (run / "config.json").exists():
            raise Fail(f"it speaks of --resume, but no run folder exists: {result.lines[-1][:200]}")
        no_leftovers(trace.path("cache"))
        succeeded(trace.bf(*argv, env=env))

    return Case(
        f"signals/pretrain-{signal.Signals(signum).name.lower()}-before-the-run-folder-exists",
        f"exit {code}, one line (no --resume without a run); the same command then runs",
        body,
    )


def finetune_signal_case(signum: int) -> Case:
    name = signal.Signals(signum).name

    def body(trace: Trace) -> None:
        out = trace.path("ft")
        argv = finetune_argv(
            M.world["bert"], out, "--epochs", "2", "--set", "train.log_every=1", train="sst-train-128.tsv"
        )
        proc = trace.start(*argv)
        target = trace.rng.randint(2, 28)
        trace.note(f"# {name} once {target} steps are logged")
        if not wait_until(lambda: steps_done(out) >= target, proc):
            raise Skip("the run ended before the signal")
        proc.send(signum, group=signum != signal.SIGTERM)
        result = proc.wait(60)
        if signum == signal.SIGKILL:
            resumed = ["finetune", "--out", out, "--resume", "--quiet"]
        else:
            if result.code != 128 + signum or "Traceback" in result.err:
                raise Fail(f"expected exit {128 + signum}, got {result.describe()}")
            resumed = continue_command(result)
        succeeded(trace.bf(*resumed))
        reference = M.world["ref-ft"]
        same_weights(out / "final" / "model.safetensors", reference / "final" / "model.safetensors")
        same_metrics(out, reference)

    return Case(
        f"signals/finetune-{name.lower()}",
        ("" if signum == signal.SIGKILL else f"exit {128 + signum} and the command that continues; ")
        + "the resumed run ends bit-identical"
        " to the uninterrupted one",
        body,
    )


def glue_signal_case(signum: int) -> Case:
    name = signal.Signals(signum).name

    def body(trace: Trace) -> None:
        out = trace.path("g")
        argv = glue_argv(out, recipes="recipes-long.toml", seeds="1,2")
        proc = trace.start(*argv)
        delay = trace.rng.uniform(0.0, 1.5)
        trace.note(f"# {name} {delay:.2f} s after the first seed's folder appears")
        if not wait_until(lambda: (out / "RTE" / "seed_1").is_dir(), proc, tick=0.01):
            raise Skip("glue ended before the signal")
        time.sleep(delay)
        if proc.poll() is not None:
            raise Skip("glue ended before the signal")
        proc.send(signum, group=signum != signal.SIGTERM)
        result = proc.wait(60)
        if signum == signal.SIGTERM and (result.code != 143 or "Traceback" in result.err):
            raise Fail(f"expected exit 143, got {result.describe()}")
        succeeded(trace.bf(*argv))
        reference = M.world["ref-glue"]
        for seed in ("seed_1", "seed_2"):
            same_weights(
                out / "RTE" / seed / "final" / "model.safetensors",
                reference / "RTE" / seed / "final" / "model.safetensors",
            )

    return Case(
        f"signals/glue-{name.lower()}",
        "rerunning the command finishes the benchmark with the uninterrupted one's models",
        body,
    )


def prepare_signal_case(signum: int) -> Case:
    name = signal.Signals(signum).name

    def body(trace: Trace) -> None:
        out = trace.path("shards")
        argv = ["prepare", "--corpus", WIKI_VALID, "--tokenizer", M.world["tok"], "--out", out]
        reference = M.world["ref-shards"]
        proc = trace.start(*argv)
        delay = trace.rng.uniform(0.05, 0.6)
        trace.note(f"# {name} {delay:.2f} s after the start")
        time.sleep(delay)
        if proc.poll() is not None:
            raise Skip("prepare ended before the signal")
        proc.send(signum, group=True)
        result = proc.wait(60)
        ended = result.code == 0 or signum == signal.SIGKILL  # a kill leaves no word of how far it got
        if ended and "Traceback" not in result.err and snapshot(out) == snapshot(reference):
            raise Skip("prepare had written its shards when the signal came, as it exited")
        if signum == signal.SIGINT:
            if result.code != 130 or "Traceback" in result.err or len(notices(result)) != 1:
                raise Fail(f"expected exit 130 and one line, got {result.describe()}")
            absent(out)
        succeeded(trace.bf(*argv))
        if snapshot(out) != snapshot(reference):
            raise Fail("the shards differ from an uninterrupted prepare's")
        no_leftovers(trace.dir)

    expected = ("exit 130, one line, nothing written; " if signum == signal.SIGINT else "") + (
        "a rerun writes the shards of an uninterrupted prepare and leaves no temporaries"
    )
    return Case(f"signals/prepare-{name.lower()}", expected, body)


def short_command_signal_case(command: str, signum: int) -> Case:
    name = signal.Signals(signum).name

    def body(trace: Trace) -> None:
        out = trace.path("out")
        argv = {
            "tokenizer-train": cmd("tokenizer train --corpus {} --vocab-size 4000 --out {}", WIKI_TRAIN, out),
            "embed": cmd(
                "embed --model {} --input {} --out {} --batch-size 1 --quiet",
                M.world["bert"],
                data("many-lines.txt"),
                out.with_suffix(".npy"),
            ),
            "evaluate": cmd(
                "evaluate --model {} --corpus {} --max-pairs 0 --quiet", M.world["bert"], WIKI_VALID
            ),
        }[command]
        proc = trace.start(*argv, env={"BERTFORGE_CACHE": str(trace.path("cache"))})
        delay = trace.rng.uniform(0.3, 1.0)
        trace.note(f"# {name} {delay:.2f} s after the start")
        time.sleep(delay)
        if proc.poll() is not None:
            raise Skip(f"{command} ended before the signal")
        proc.send(signum, group=signum == signal.SIGINT)
        result = proc.wait(60)
        if not stopped(result, signum) or len(notices(result)) > 1:
            raise Fail(f"expected exit {128 + signum} and at most one line, got {result.describe()}")
        absent(out)
        absent(out.with_suffix(".npy"))
        no_leftovers(trace.path("cache"))

    return Case(
        f"signals/{command}-{name.lower()}", f"exit {128 + signum}, at most one line, nothing written", body
    )


# -- two processes at once


def concurrency_cases() -> list[Case]:
    return [
        same_out_case("pretrain", lambda t, o, i: pretrain_argv(o, "--max-steps", "20")),
        same_out_case("finetune", lambda t, o, i: finetune_argv(M.world["bert"], o)),
        same_out_case("glue", lambda t, o, i: glue_argv(o)),
        same_out_case(
            "prepare",
            lambda t, o, i: cmd(
                "prepare --corpus {} --tokenizer {} --out {}",
                data(("train.tokens", "valid.tokens")[i]),
                M.world["tok"],
                o,
            ),
            distinct=True,
        ),
        same_out_case(
            "tokenizer-train",
            lambda t, o, i: cmd(
                "tokenizer train --corpus {} --vocab-size 500 --out {}",
                data(("train.tokens", "valid.tokens")[i]),
                o,
            ),
            distinct=True,
        ),
        same_out_case(
            "export",
            lambda t, o, i: ["export", "--model", M.world[("bert", "gpt")[i]], "--out", o],
            distinct=True,
        ),
        same_out_case(
            "import-hf",
            lambda t, o, i: ["import-hf", "--from", M.world[("hf", "hf-gpt")[i]], "--out", o],
            distinct=True,
        ),
        same_out_case(
            "embed",
            lambda t, o, i: cmd(
                "embed --model {} --input {} --out {} --quiet",
                M.world["bert"],
                data(("lines.txt", "few-lines.txt")[i]),
                o.with_suffix(".npy"),
            ),
            distinct=True,
        ),
        cold_cache_case(),
        resume_while_running_case(),
        read_while_training_case(),
    ]


def same_out_case(command: str, argv: Callable[[Trace, Path, int], list], distinct: bool = False) -> Case:
    """Two processes on one output at once: one is refused, or (for outputs written whole) both end and
    the output is one of the two complete results."""

    def body(trace: Trace) -> None:
        out = trace.path("out")
        first, second = (trace.start(*argv(trace, out, i)) for i in (0, 1 if distinct else 0))
        results = [first.wait(300), second.wait(300)]
        wins = [either(result) for result in results]
        if not any(wins):
            raise Fail("both were refused")
        if all(wins) and distinct:
            raise Fail("both reported success on one output; it holds only one of the two")
        target = out.with_suffix(".npy") if command == "embed" else out
        if not target.exists():
            raise Fail("the output is missing")
        no_leftovers(trace.dir)

    expected = "one runs, the other is refused with " + REFUSED + "; the output complete, no leftovers"
    return Case(f"concurrency/two-{command}-on-one-out", expected, body)


def cold_cache_case() -> Case:
    def body(trace: Trace) -> None:
        env = {"BERTFORGE_CACHE": str(trace.path("cache"))}
        argv = ["--corpus", data("train.tokens"), *TINY, "--max-steps", "3"]
        procs = [trace.start("pretrain", "--out", trace.path(f"run{i}"), *argv, env=env) for i in (1, 2)]
        for proc in procs:
            succeeded(proc.wait(300))
        same_weights(
            trace.path("run1") / "final" / "model.safetensors",
            trace.path("run2") / "final" / "model.safetensors",
        )
        no_leftovers(trace.path("cache"))

    return Case(
        "concurrency/two-pretrain-on-a-cold-cache",
        "both end with the same model; the cache holds no temporaries",
        body,
    )


def resume_while_running_case() -> Case:
    def body(trace: Trace) -> None:
        run = trace.path("run")
        proc = trace.start(*pretrain_argv(run, *STEADY, "--max-steps", str(STEADY_STEPS)))
        if not wait_until(lambda: steps_done(run) >= 2, proc):
            raise Skip("the run ended first")
        refused(trace.bf("pretrain", "--out", run, "--resume", "--quiet"), str(proc.pid))
        succeeded(proc.wait(300))
        same_run(run, M.world["ref-bert"])

    return Case(
        "concurrency/resume-while-the-run-trains",
        REFUSED + " naming the owner's PID; the run ends undisturbed",
        body,
    )


def read_while_training_case() -> Case:
    def body(trace: Trace) -> None:
        run = trace.path("run")
        argv = pretrain_argv(
            run,
            "--set",
            "train.checkpoint_every=1",
            "--set",
            "train.keep_checkpoints=1",
            "--set",
            "train.eval_every=100000",
            "--max-steps",
            "120",
        )
        proc = trace.start(*argv)
        if not wait_until(lambda: (run / "checkpoints").is_dir(), proc):
            raise Skip("the run ended first")
        for _ in range(3):
            if proc.poll() is not None:
                break
            either(trace.bf("fill-mask", "--model", run, "the [MASK] was released ."))
        succeeded(proc.wait(300))

    return Case(
        "concurrency/fill-mask-while-checkpoints-are-pruned", EITHER + " each time; the run ends", body
    )


# -- full and read-only disks


def disk_cases() -> list[Case]:
    fractions = [0.0, 0.05, 0.2, 0.5, 0.8]
    return [
        *(full_run_disk_case(f) for f in fractions),
        full_finetune_disk_case(0.3),
        full_glue_disk_case(0.3),
        full_cache_disk_case(),
        *(
            full_out_disk_case(command)
            for command in OUT_USERS
            if command not in ("pretrain", "finetune", "glue")
        ),
        read_only_case("fill-mask", lambda d: fill_mask(None, d / "bert"), "bert", works=True),
        read_only_case(
            "evaluate",
            lambda d: cmd(
                "evaluate --model {} --corpus {} --max-pairs 8 --quiet", d / "bert", data("valid.tokens")
            ),
            "bert",
            works=True,
        ),
        read_only_case("classify", lambda d: classify(None, d / "clf"), "clf", works=True),
        read_only_case(
            "pretrain-resume",
            lambda d: ["pretrain", "--out", d / "bert", "--resume", "--max-steps", "8", "--quiet"],
            "bert",
            works=False,
        ),
        read_only_case(
            "export-out",
            lambda d: ["export", "--model", M.world["bert"], "--out", d / "hf"],
            None,
            works=False,
        ),
        read_only_cache_case(),
    ]


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def full_run_disk_case(fraction: float) -> Case:
    def body(trace: Trace) -> None:
        reference = M.world["ref-bert"]
        free = int(folder_size(reference) * fraction)
        disk = mount_disk(trace.path("disk"), free)
        trace.note(f"# {shorten(str(disk))}: a tmpfs with {free:,} bytes free")
        run = disk / "run"
        argv = pretrain_argv(run, *STEADY, "--max-steps", str(STEADY_STEPS))
        result = trace.bf(*argv)
        if result.code == 0:
            raise Skip(f"the run fit in {free:,} bytes")
        refused(result, "no space left")
        free_disk(disk)
        trace.note(f"rm {shorten(str(disk))}/.filler")
        again = ["pretrain", "--out", run, "--resume", "--quiet"] if (run / "config.json").exists() else argv
        succeeded(trace.bf(*again))
        same_run(run, reference)
        no_leftovers(run)

    return Case(
        f"disk/pretrain-run-folder-full-at-{int(fraction * 100)}pct",
        REFUSED + " naming the path and "
        "'no space left'; after freeing space, --resume (or, where no run was saved, the same command) ends "
        "bit-identical to the uninterrupted run",
        body,
        disk=True,
    )


def full_finetune_disk_case(fraction: float) -> Case:
    def body(trace: Trace) -> None:
        reference = M.world["clf"]
        disk = mount_disk(trace.path("disk"), int(folder_size(reference) * fraction))
        out = disk / "ft"
        argv = finetune_argv(M.world["bert"], out)
        refused(trace.bf(*argv), "no space left")
        free_disk(disk)
        again = (
            ["finetune", "--out", out, "--resume", "--quiet"] if (out / "finetune.json").exists() else argv
        )
        succeeded(trace.bf(*again))
        same_weights(out / "final" / "model.safetensors", reference / "final" / "model.safetensors")

    return Case(
        "disk/finetune-out-full",
        REFUSED + " naming 'no space left'; after freeing space, --resume (or the same command, where no "
        "run was saved) ends bit-identical to the uninterrupted run",
        body,
        disk=True,
    )


def full_glue_disk_case(fraction: float) -> Case:
    def body(trace: Trace) -> None:
        reference = M.world["glue"]
        disk = mount_disk(trace.path("disk"), int(folder_size(reference) * fraction))
        argv = glue_argv(disk / "g")
        refused(trace.bf(*argv), "no space left")
        free_disk(disk)
        succeeded(trace.bf(*argv))
        for seed in ("seed_1",):
            same_weights(
                disk / "g" / "RTE" / seed / "final" / "model.safetensors",
                reference / "RTE" / seed / "final" / "model.safetensors",
            )

    return Case(
        "disk/glue-out-full",
        REFUSED + " naming 'no space left'; the rerun after freeing space ends "
        "with the uninterrupted benchmark's models",
        body,
        disk=True,
    )


def full_cache_disk_case() -> Case:
    def body(trace: Trace) -> None:
        disk = mount_disk(trace.path("disk"), 150_000)
        env = {"BERTFORGE_CACHE": str(disk / "cache")}
        result = trace.bf(
            "pretrain", "--corpus", WIKI_VALID, "--out", trace.path("run"), *TINY, "--max-steps", "2", env=env
        )
        line = refused(result, "no space left")
        if str(disk) not in line:
            raise Fail(f"the line does not name the cache's path: {line[:200]}")
        no_leftovers(disk)

    return Case(
        "disk/cache-full",
        REFUSED + " naming the cache path and 'no space left'; no temporaries",
        body,
        disk=True,
    )


def full_out_disk_case(command: str) -> Case:
    def body(trace: Trace) -> None:
        disk = mount_disk(trace.path("disk"), 0 if command == "embed" else 20_000)  # embed writes 3 kB
        out = disk / "out"
        result = trace.bf(*OUT_USERS[command](trace, out))
        line = refused(result, "no space left")
        if str(disk) not in line:
            raise Fail(f"the line does not name the path: {line[:200]}")
        for target in (out, out.with_suffix(".npy"), out.with_suffix(".png")):
            absent(target)

    return Case(
        f"disk/{command}-out-full",
        REFUSED + " naming the path and 'no space left'; nothing written",
        body,
        disk=True,
    )


def read_only_case(name: str, argv: Callable[[Path], list], fixture: str | None, works: bool) -> Case:
    def body(trace: Trace) -> None:
        disk = mount_disk(trace.path("disk"), 32 << 20)
        free_disk(disk)
        if fixture:
            shutil.copytree(M.world[fixture], disk / fixture)
            trace.note(f"cp -r $W/fixtures/{fixture} {shorten(str(disk))}/")
        read_only(disk)
        trace.note(f"mount -o remount,ro {shorten(str(disk))}")
        result = trace.bf(*argv(disk))
        if works:
            succeeded(result)
        else:
            refused(result, "read-only")

    expected = OK + " (nothing to write)" if works else REFUSED + " saying the file system is read-only"
    return Case(f"disk/read-only-{name}", expected, body, disk=True)


def read_only_cache_case() -> Case:
    def body(trace: Trace) -> None:
        disk = mount_disk(trace.path("disk"), 32 << 20)
        free_disk(disk)
        env = {"BERTFORGE_CACHE": str(disk / "cache")}
        argv = pretrain_argv(trace.path("run1"), "--max-steps", "2", corpus="valid.tokens")
        succeeded(trace.bf(*argv, env=env))
        read_only(disk)
        trace.note(f"mount -o remount,ro {shorten(str(disk))}")
        argv[argv.index("--out") + 1] = trace.path("run2")
        either(trace.bf(*argv, env=env), "read-only")

    return Case("disk/read-only-warm-cache", EITHER + " (the cache's entries are all there)", body, disk=True)


# ------------------------------------------------------------------------------------- running


def selected(all_cases: list[Case], only: str | None) -> list[Case]:
    if not only:
        return all_cases
    parts = [part.strip() for part in only.split(",") if part.strip()]

    def keep(name: str) -> bool:
        return any(fnmatch.fnmatch(name, p) if any(c in p for c in "*?[") else p in name for p in parts)

    return [case for case in all_cases if keep(case.name)]


def run_case(case: Case) -> Outcome:
    started = time.monotonic()
    trace = Trace(case.name)
    try:
        if case.disk:
            for fixture in DISK_FIXTURES:  # built here, where the report and later cases see them
                M.world[fixture]
            run_in_namespace(case, trace)
        else:
            case.body(trace)
            if trace.after:
                trace.after()
        result = "pass"
    except Fail as failure:
        result = f"FAIL: {failure}"
    except Skip as skip:
        result = f"skip: {skip}"
    except Exception as error:  # a bug of the matrix: shown, never hidden as a pass
        result = f"FAIL: the matrix itself broke: {error!r}"
        traceback.print_exc()
        traceback.print_exc()
    finally:
        trace.close()
    modified = M.world.changed()
    if modified and result == "pass":
        result = f"FAIL: it changed the fixture(s) it was given: {', '.join(modified)}"
    return Outcome(case, trace.lines, result, time.monotonic() - started)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def report(outcomes: list[Outcome], seconds: float) -> str:
    counts = {kind: sum(o.result.startswith(kind) for o in outcomes) for kind in ("pass", "FAIL", "skip")}
    mode = "each command a new Python (--exec)" if M.exec_mode else "each command forked after imports"
    lines = [
        "# Fault matrix",
        "",
        f"{len(outcomes)} cases: **{counts['pass']} pass, {counts['FAIL']} FAIL, {counts['skip']} skipped** "
        f"({datetime.date.today()}, seed {M.seed}, {mode}, {seconds / 60:.1f} min).",
        "",
        f"`$W` is {M.work}, `$DATA` is {DATA}; `$TINY` is `{shlex.join(TINY)}`, `$STEADY` is "
        f"`{shlex.join(STEADY)}`, `$FT` is `{shlex.join(FINETUNE_FLAGS)}`. Every command runs with "
        f"`BERTFORGE_CACHE=$W/cache` unless it says otherwise, in the case's folder `$W/cases/NAME`.",
        "",
        "Fixtures, built by:",
        "",
        *(f"- `{command}`" for command in M.fixture_commands),
        "",
    ]
    failures = [o for o in outcomes if o.result.startswith("FAIL")]
    if failures:
        lines += ["## FAIL", "", *(f"- `{o.case.name}`: {cell(o.result[6:])}" for o in failures), ""]
    lines += ["## Cases", "", "| case | command | expected | result |", "|---|---|---|---|"]
    for o in outcomes:
        command = "<br>".join(f"`{cell(c)}`" for c in o.commands)
        result = f"{o.result} ({o.seconds:.1f} s)"
        lines.append(f"| {o.case.name} | {command} | {cell(o.case.expected)} | {cell(result)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    global M, FIXTURE_TRACE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", required=True, type=Path, help="folder for the report, the work and the logs"
    )
    parser.add_argument("--only", help="comma-separated parts of case names (or patterns with * and ?)")
    parser.add_argument("--seed", type=int, default=0, help="picks the random moments of signals and kills")
    parser.add_argument("--exec", action="store_true", help="run each command as a new `python -m bertforge`")
    parser.add_argument("--list", action="store_true", help="print the cases' names and stop")
    args = parser.parse_args(argv)
    M = Matrix(args.out, args.seed, args.exec)
    chosen = selected(cases(), args.only)
    if args.list:
        print("\n".join(case.name for case in chosen))
        return 0
    if not chosen:
        parser.error(f"no case matches --only {args.only!r}")
    for folder in (M.work, M.logs):
        folder.mkdir(parents=True, exist_ok=True)
    if not args.exec:
        warm_imports()
    FIXTURE_TRACE = Trace("fixtures")
    started = time.monotonic()
    outcomes = []
    for number, case in enumerate(chosen, 1):
        outcome = run_case(case)
        outcomes.append(outcome)
        print(f"[{number}/{len(chosen)}] {case.name}: {outcome.result} ({outcome.seconds:.1f} s)", flush=True)
    page = M.out / "fault-matrix.md"
    page.write_text(report(outcomes, time.monotonic() - started), encoding="utf-8")
    failed = sum(o.result.startswith("FAIL") for o in outcomes)
    print(f"{len(outcomes)} cases, {failed} FAIL; the table: {page}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
