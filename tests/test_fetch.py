"""`bertforge fetch`: public corpora downloaded once into the cache, checked before they are kept, and
nothing half-written left behind; and `make demo`'s choice between the shared copy and the fetched one.

Every download here is from a server on 127.0.0.1 that the test starts, serving files it makes."""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import assert_clean_failure
from tqdm import tqdm

from bertforge import download
from bertforge.cli import main
from bertforge.download import CORPORA, Corpus, RemoteFile, digests, fetch_corpus

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "".join(f" = Article {i} = \n\n Text of article {i} , with <unk> words . \n\n" for i in range(400))
VALID = " = Held out = \n\n Some held @-@ out text . \n\n" * 50


class Server(http.server.ThreadingHTTPServer):
    """Serves `files` (path -> bytes) and logs each request; `/cut/...` sends a Content-Length, half the
    bytes, then closes; `/stall/...` sends its headers and then nothing for a while."""

    daemon_threads = True

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.files, self.requests = files, []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        body = self.server.files.get(self.path.removeprefix("/cut").removeprefix("/stall"))
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path.startswith("/stall"):
            time.sleep(2)
        elif self.path.startswith("/cut"):
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
        else:
            self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    files = {"/train.txt": TRAIN.encode(), "/valid.txt": VALID.encode()}
    server = Server(files)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def git_object_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def remote(server: Server, name: str, path: str, body: bytes, **changes) -> RemoteFile:
    fields = {"git_blob": git_object_id(body), "sha256": hashlib.sha256(body).hexdigest()} | changes
    return RemoteFile(name, server.url(path), **fields)


def serve_wikitext(monkeypatch, server: Server, train_path="/train.txt", **train_changes) -> Corpus:
    """Point `wikitext-2` at the test's server (the train file at `train_path`, with `train_changes`)."""
    corpus = Corpus(
        "wikitext-2",
        (
            remote(server, "wiki.train.tokens", train_path, TRAIN.encode(), **train_changes),
            remote(server, "wiki.valid.tokens", "/valid.txt", VALID.encode()),
        ),
        "put the files in {folder}",
    )
    monkeypatch.setitem(CORPORA, "wikitext-2", corpus)
    monkeypatch.setattr(download, "TIMEOUT_S", 0.5)
    return corpus


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def test_a_download_is_checked_kept_and_reused_without_a_request(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server)
    assert main(["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == tmp_path / "data" / "wikitext-2"
    assert (folder / "wiki.train.tokens").read_text(encoding="utf-8") == TRAIN
    assert (folder / "wiki.valid.tokens").read_text(encoding="utf-8") == VALID
    assert files_under(tmp_path) == ["data/wikitext-2/wiki.train.tokens", "data/wikitext-2/wiki.valid.tokens"]
    assert server.requests == ["/train.txt", "/valid.txt"]

    assert main(["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]) == 0
    assert Path(capsys.readouterr().out.strip()) == folder
    assert server.requests == ["/train.txt", "/valid.txt"]  # no second request


def test_the_cache_defaults_to_bertforge_cache(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server)
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "home-cache"))
    assert main(["fetch", "wikitext-2", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "home-cache" / "data" / "wikitext-2")


@pytest.mark.parametrize("wrong", ["git_blob", "sha256"])
def test_other_bytes_than_expected_are_refused_and_not_kept(tmp_path, server, monkeypatch, capsys, wrong):
    serve_wikitext(monkeypatch, server, **{wrong: git_object_id(b"other bytes")})
    argv = ["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]
    err = assert_clean_failure(capsys, argv, "sent other bytes than expected")
    assert server.url("/train.txt") in err
    assert files_under(tmp_path) == []


def test_a_cut_connection_leaves_nothing_half_written(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server, train_path="/cut/train.txt")
    argv = ["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]
    assert_clean_failure(capsys, argv, f"the connection closed after {len(TRAIN) // 2} ")
    assert server.requests == ["/cut/train.txt"]
    assert files_under(tmp_path) == []


def test_a_server_that_stops_sending_times_out(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server, train_path="/stall/train.txt")
    argv = ["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]
    assert_clean_failure(capsys, argv, "timed out")
    assert files_under(tmp_path) == []


def test_a_missing_file_on_the_server_is_one_line(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server, train_path="/gone.txt")
    argv = ["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]
    assert_clean_failure(capsys, argv, "HTTP 404")
    assert files_under(tmp_path) == []


def test_no_network_says_how_to_get_the_corpus_or_run_on_any_text(tmp_path, server, monkeypatch, capsys):
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve_wikitext(monkeypatch, server)
    dead = RemoteFile("wiki.train.tokens", f"http://127.0.0.1:{port}/train.txt", "0" * 40)
    monkeypatch.setitem(CORPORA, "wikitext-2", Corpus("wikitext-2", (dead,), "put the files in {folder}"))
    err = assert_clean_failure(capsys, ["fetch", "wikitext-2", "--cache-dir", str(tmp_path)], "refused")
    assert f"run `bertforge fetch wikitext-2 --cache-dir {tmp_path}` again" in err  # the cache it was given
    assert f"put the files in {tmp_path / 'data' / 'wikitext-2'}, " in err
    assert "make demo CORPUS=my.txt VALID=my-valid.txt" in err
    assert files_under(tmp_path) == []


def test_what_a_killed_download_left_is_removed_by_the_next(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server)
    folder = tmp_path / "data" / "wikitext-2"
    folder.mkdir(parents=True)
    (folder / ".wiki.train.tokens.tmp-killed").write_text("half of it")
    assert main(["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]) == 0
    assert files_under(tmp_path) == ["data/wikitext-2/wiki.train.tokens", "data/wikitext-2/wiki.valid.tokens"]


def test_a_file_put_in_the_folder_by_hand_is_checked(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server)
    folder = tmp_path / "data" / "wikitext-2"
    folder.mkdir(parents=True)
    (folder / "wiki.train.tokens").write_text(TRAIN, encoding="utf-8")
    (folder / "wiki.valid.tokens").write_text(VALID[: len(VALID) // 2], encoding="utf-8")  # cut short
    argv = ["fetch", "wikitext-2", "--cache-dir", str(tmp_path), "--quiet"]
    err = assert_clean_failure(capsys, argv, "is not wikitext-2's wiki.valid.tokens")
    assert f"delete it and run `bertforge fetch wikitext-2 --cache-dir {tmp_path}` again" in err
    assert server.requests == []
    (folder / "wiki.valid.tokens").write_text(VALID, encoding="utf-8")
    assert main(argv) == 0 and server.requests == []


def test_progress_off_a_terminal_is_plain_lines_and_quiet_is_silent(tmp_path, server, monkeypatch, capsys):
    serve_wikitext(monkeypatch, server)
    monkeypatch.setattr(download, "CHUNK", 1024)  # several reads, so that the tenths show
    fetch_corpus("wikitext-2", tmp_path / "loud")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"bertforge: downloading {server.url('/train.txt')}"
    train = [line for line in lines if line.startswith("wiki.train.tokens: ")]
    percents = [int(line.split()[1].rstrip("%")) for line in train]
    assert len(train) == 10 and percents == sorted(set(percents)) and percents[-1] == 100  # one a tenth
    size = tqdm.format_sizeof(len(TRAIN), "B")
    assert f"({size}/{size})" in train[-1]
    fetch_corpus("wikitext-2", tmp_path / "quiet", show_progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_git_object_id_is_what_git_prints(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text(TRAIN, encoding="utf-8")
    printed = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert digests(path) == (printed.stdout.strip(), hashlib.sha256(TRAIN.encode()).hexdigest())


def make_demo_plan(shared: Path, cache: Path) -> str:
    """The commands `make demo` would run (`make -n`), with the shared folder and the cache given."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")} | {
        "BERTFORGE_CACHE": str(cache)
    }
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "demo", f"SHARED={shared}"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_fetches_wikitext_where_the_shared_copy_is_missing(tmp_path, server, monkeypatch, capsys):
    cache, shared = tmp_path / "cache", tmp_path / "shared" / "wikitext-2"
    plan = make_demo_plan(shared, cache)
    assert f"bertforge fetch wikitext-2 --cache-dir {cache}" in plan
    assert f"--corpus {cache}/data/wikitext-2/wiki.train.tokens" in plan
    assert f"--valid {cache}/data/wikitext-2/wiki.valid.tokens" in plan

    serve_wikitext(monkeypatch, server)
    assert main(["fetch", "wikitext-2", "--cache-dir", str(cache), "--quiet"]) == 0
    assert "bertforge fetch" not in make_demo_plan(shared, cache)  # the fetched files are where make looks

    shared.mkdir(parents=True)
    plan = make_demo_plan(shared, cache)
    assert f"--corpus {shared}/wiki.train.tokens" in plan and "bertforge fetch" not in plan
