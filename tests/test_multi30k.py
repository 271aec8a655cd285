"""Multi30k on any machine: the resolver's order, and the download against a local HTTP server on 127.0.0.1 (an empty
cache, a second call served from the cache, a corrupted file, an unreachable server)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import shutil
import socket
import threading
from functools import partial
from pathlib import Path

import pytest

from hf_headattn.experiment import multi30k as m
from hf_headattn.experiment.multi30k import Multi30kChecksumError, Multi30kNotFoundError, find_multi30k
from hf_headattn.experiment.recipe_parts import ParallelDataArguments, load_recipe_data

EN_DE = ("en", "de")
#: The real files beside the repository (this checkout's ../shared), read before any test moves the resolver.
REAL = m.BESIDE_REPOSITORY


class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.server.requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def serve():
    """``serve(folder)``: the base URL of an HTTP server on 127.0.0.1 serving ``folder``; ``.requests`` lists paths."""
    servers = []

    def start(folder: Path):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(folder)))
        server.requests = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/data/task1/raw/", server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def nowhere_else(tmp_path, monkeypatch):
    """No copy anywhere: no HF_HEADATTN_DATA, no ../shared beside the repository, an empty cache under tmp_path."""
    monkeypatch.delenv(m.DATA_ENV, raising=False)
    monkeypatch.delenv(m.URL_ENV, raising=False)
    monkeypatch.setattr(m, "BESIDE_REPOSITORY", tmp_path / "no-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hf_headattn" / "multi30k"


def _write_corpus(folder: Path, languages=EN_DE, lines=3) -> dict[str, str]:
    """Small gzipped Multi30k-shaped files; returns each file's SHA-256."""
    folder.mkdir(parents=True, exist_ok=True)
    sums = {}
    for name in m.file_names(languages):
        prefix, lang = name.split(".")[:2]
        data = gzip.compress("".join(f"{prefix} {lang} {i}\n" for i in range(lines)).encode(), mtime=0)
        (folder / name).write_bytes(data)
        sums[name] = hashlib.sha256(data).hexdigest()
    return sums


@pytest.fixture
def mirror(tmp_path, monkeypatch, serve):
    """A mirror of small files laid out as the public repository, their checksums pinned in place of the real ones."""
    folder = tmp_path / "mirror" / "data" / "task1" / "raw"
    monkeypatch.setattr(m, "SHA256", {**m.SHA256, **_write_corpus(folder)})
    url, server = serve(tmp_path / "mirror")
    monkeypatch.setenv(m.URL_ENV, url)
    return folder, server


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_download_into_an_empty_cache_then_served_from_it(nowhere_else, mirror):
    source, server = mirror
    cache = nowhere_else
    assert find_multi30k(languages=EN_DE) == cache
    assert sorted(p.name for p in cache.iterdir()) == sorted(m.file_names(EN_DE))
    for name in m.file_names(EN_DE):
        assert (cache / name).read_bytes() == (source / name).read_bytes()
    assert sorted(server.requests) == sorted(f"/data/task1/raw/{name}" for name in m.file_names(EN_DE))
    server.requests.clear()
    assert find_multi30k(languages=EN_DE) == cache
    assert server.requests == []  # the second call reads the cache, no request
    assert find_multi30k(languages=["en"]) == cache and server.requests == []
    # a language not cached yet: only its files are fetched
    m.SHA256.update(_write_corpus(source, ["fr"]))  # the fixture's patched copy
    assert find_multi30k(languages=["en", "fr"]) == cache
    assert sorted(server.requests) == sorted(f"/data/task1/raw/{name}" for name in m.file_names(["fr"]))


def test_a_corrupted_file_is_named_and_not_kept(nowhere_else, mirror):
    source, _ = mirror
    good = (source / "val.de.gz").read_bytes()
    (source / "val.de.gz").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    bad = hashlib.sha256((source / "val.de.gz").read_bytes()).hexdigest()
    with pytest.raises(Multi30kChecksumError) as error:
        find_multi30k(languages=EN_DE)
    message = str(error.value)
    assert "val.de.gz" in message and bad in message and m.SHA256["val.de.gz"] in message
    assert not (nowhere_else / "val.de.gz").exists()
    assert _leftovers(nowhere_else) == []  # no partial file
    (source / "val.de.gz").write_bytes(good)  # the mirror mended: the next call completes the cache
    assert find_multi30k(languages=EN_DE) == nowhere_else


def test_an_unreachable_server_names_the_three_ways(nowhere_else, monkeypatch):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv(m.URL_ENV, f"http://127.0.0.1:{port}/raw/")
    with pytest.raises(Multi30kNotFoundError) as error:
        find_multi30k(languages=EN_DE, timeout=5)
    message = str(error.value)
    for way in ("--multi30k_dir", m.DATA_ENV, m.URL_ENV, str(nowhere_else), f"127.0.0.1:{port}"):
        assert way in message
    assert not nowhere_else.exists() or _leftovers(nowhere_else) == []


def test_a_missing_file_on_the_server_is_an_error_naming_it(nowhere_else, mirror):
    source, _ = mirror
    (source / "train.en.gz").unlink()
    with pytest.raises(Multi30kNotFoundError, match=r"downloading train\.en\.gz .*404"):
        find_multi30k(languages=EN_DE)


def test_no_download_and_unknown_languages(nowhere_else, mirror):
    with pytest.raises(Multi30kNotFoundError, match=r"download=False.*Provide it in one of three ways"):
        find_multi30k(languages=EN_DE, download=False)
    with pytest.raises(Multi30kNotFoundError, match=r"no language \['ja'\] to download; it has \['en', 'de', 'fr'"):
        find_multi30k(languages=["en", "ja"])


def test_order_explicit_then_environment_then_beside_then_cache(nowhere_else, tmp_path, monkeypatch, mirror):
    given, env, beside = tmp_path / "given", tmp_path / "env", tmp_path / "beside"
    for folder in (given, env / "multi30k", beside, nowhere_else):
        _write_corpus(folder)
    _, server = mirror
    monkeypatch.setattr(m, "BESIDE_REPOSITORY", beside)
    assert find_multi30k(languages=EN_DE) == beside  # beside the repository before the cache
    shutil.rmtree(beside)
    assert find_multi30k(languages=EN_DE) == nowhere_else  # the cache
    monkeypatch.setenv(m.DATA_ENV, str(env))
    assert find_multi30k(languages=EN_DE) == env / "multi30k"  # a data folder holding multi30k/
    monkeypatch.setenv(m.DATA_ENV, str(env / "multi30k"))
    assert find_multi30k(languages=EN_DE) == env / "multi30k"  # the Multi30k folder itself
    assert find_multi30k(given, languages=EN_DE) == given  # an explicit folder first
    assert server.requests == []


def test_a_given_folder_without_the_files_is_an_error_not_a_fall_through(nowhere_else, tmp_path, monkeypatch):
    folder = tmp_path / "given"
    _write_corpus(folder, ["en"])
    _write_corpus(nowhere_else)  # a complete cache must not be used instead
    with pytest.raises(Multi30kNotFoundError, match=r"multi30k_dir '.*given' lacks \['train\.de\.gz'"):
        find_multi30k(folder, languages=EN_DE)
    with pytest.raises(Multi30kNotFoundError, match=r"multi30k_dir '.*nothing' is not a folder"):
        find_multi30k(tmp_path / "nothing", languages=EN_DE)
    monkeypatch.setenv(m.DATA_ENV, str(folder))
    with pytest.raises(Multi30kNotFoundError, match=rf"{m.DATA_ENV} '.*given' lacks"):
        find_multi30k(languages=EN_DE)
    for name in m.file_names(["de"]):  # uncompressed files count too
        (folder / name[:-3]).write_text("x\n")
    assert find_multi30k(folder, languages=EN_DE) == folder


def test_the_recipes_data_without_a_data_flag_is_multi30k_found_by_the_resolver(nowhere_else, tmp_path, monkeypatch):
    _write_corpus(tmp_path / "data", lines=4)
    monkeypatch.setenv(m.DATA_ENV, str(tmp_path / "data"))
    raw = load_recipe_data(ParallelDataArguments(source_lang="en", target_lang="de"))
    assert sorted(raw) == sorted(m.SPLITS)
    assert raw["validation"][3]["translation"] == {"en": "val en 3", "de": "val de 3"}


def test_the_pinned_checksums_are_the_real_files(nowhere_else, serve, monkeypatch):
    """The real files (../shared's copy of the public repository's raw files) pass the pinned SHA-256."""
    if not REAL.is_dir():
        pytest.skip(f"no copy of the real files at {REAL}")
    root = nowhere_else.parent.parent / "mirror"
    (root / "data" / "task1").mkdir(parents=True)
    (root / "data" / "task1" / "raw").symlink_to(REAL)
    url, server = serve(root)
    monkeypatch.setenv(m.URL_ENV, url)
    assert find_multi30k() == nowhere_else
    assert len(server.requests) == len(m.SHA256) == 12
