"""Multi30k on any machine: the resolver's order, the check of every file it returns against the pinned SHA-256 (and
the record that spares re-hashing), and the download against a local HTTP server on 127.0.0.1 (an empty cache, a
second call served from the cache, a corrupted file, a transfer cut short, an unreachable server, an unusable cache)."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import json
import os
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
def raw_server():
    """``raw_server(reply)``: the base URL of a TCP server on 127.0.0.1 that answers each request with the bytes
    ``reply`` and closes the connection (a reply no HTTP server would send: a body shorter than announced, ...)."""
    sockets = []

    def start(reply: bytes) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        sockets.append(listener)

        def answer():
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:  # closed at the end of the test
                    return
                with connection:
                    connection.recv(1 << 16)
                    connection.sendall(reply)

        threading.Thread(target=answer, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/raw/"

    yield start
    for listener in sockets:
        listener.close()


@pytest.fixture
def nowhere_else(tmp_path, monkeypatch):
    """No copy anywhere: no HF_HEADATTN_DATA, no ../shared beside the repository, an empty cache under tmp_path."""
    monkeypatch.delenv(m.DATA_ENV, raising=False)
    monkeypatch.delenv(m.URL_ENV, raising=False)
    monkeypatch.setattr(m, "BESIDE_REPOSITORY", tmp_path / "no-shared")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "hf_headattn" / "multi30k"


@pytest.fixture(autouse=True)
def pins(monkeypatch):
    """The pinned checksums, a copy per test: :func:`_write_corpus` pins its small files in place of the real ones."""
    monkeypatch.setattr(m, "SHA256", dict(m.SHA256))
    monkeypatch.setattr(m, "TEXT_SHA256", dict(m.TEXT_SHA256))


def _write_corpus(folder: Path, languages=EN_DE, lines=3) -> None:
    """Small gzipped Multi30k-shaped files, their SHA-256 (gzipped and decompressed) pinned for this test."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in m.file_names(languages):
        prefix, lang = name.split(".")[:2]
        text = "".join(f"{prefix} {lang} {i}\n" for i in range(lines)).encode()
        data = gzip.compress(text, mtime=0)
        (folder / name).write_bytes(data)
        m.SHA256[name], m.TEXT_SHA256[name] = hashlib.sha256(data).hexdigest(), hashlib.sha256(text).hexdigest()


def _gunzip(folder: Path, names) -> None:
    """``name`` -> its decompressed ``name[:-3]`` (a plain file in place of the gzipped one)."""
    for name in names:
        (folder / name[:-3]).write_bytes(gzip.decompress((folder / name).read_bytes()))
        (folder / name).unlink()


def _damage(path: Path) -> str:
    """Cut ``path`` to half its size; returns its new SHA-256."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def mirror(tmp_path, monkeypatch, serve):
    """A mirror of small files laid out as the public repository, their checksums pinned in place of the real ones."""
    folder = tmp_path / "mirror" / "data" / "task1" / "raw"
    _write_corpus(folder)
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
    _write_corpus(source, ["fr"])
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
    _write_corpus(folder, ["de"])
    _gunzip(folder, m.file_names(["de"]))  # uncompressed files count too
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
    plain = nowhere_else.parent / "plain"  # and their decompressed texts pass the pinned text SHA-256
    plain.mkdir()
    for name in m.file_names():
        (plain / name[:-3]).write_bytes(gzip.decompress((REAL / name).read_bytes()))
    assert find_multi30k(plain) == plain and len(m.TEXT_SHA256) == 12


def test_a_damaged_cached_file_is_downloaded_again_with_one_warning(nowhere_else, mirror):
    source, server = mirror
    cache = nowhere_else
    assert find_multi30k(languages=EN_DE) == cache
    server.requests.clear()
    bad = _damage(cache / "val.de.gz")  # a truncated gzip file, which would end later in a bare EOFError
    with pytest.raises(Multi30kChecksumError) as error:
        find_multi30k(languages=EN_DE, download=False)
    for said in (str(cache / "val.de.gz"), bad, m.SHA256["val.de.gz"], "download"):
        assert said in str(error.value)
    with pytest.warns(UserWarning) as caught:
        assert find_multi30k(languages=EN_DE) == cache
    assert [str(w.message) for w in caught if "val.de.gz" in str(w.message)] == [str(w.message) for w in caught]
    assert len(caught) == 1 and bad in str(caught[0].message)
    assert server.requests == ["/data/task1/raw/val.de.gz"]
    assert (cache / "val.de.gz").read_bytes() == (source / "val.de.gz").read_bytes()
    # a plain file in the cache is checked against the decompressed text's checksum, and replaced likewise
    (cache / "train.en").write_bytes(b"damaged\n")
    server.requests.clear()
    with pytest.warns(UserWarning, match=r"train\.en "):
        assert find_multi30k(languages=EN_DE) == cache
    assert server.requests == ["/data/task1/raw/train.en.gz"] and not (cache / "train.en").exists()
    assert _leftovers(cache) == []
    # only the requested languages' files are checked
    _damage(cache / "val.en.gz")
    assert find_multi30k(languages=["de"]) == cache


def test_a_damaged_file_in_a_given_folder_is_an_error_naming_it_and_the_remedy(nowhere_else, tmp_path, monkeypatch):
    given = tmp_path / "given"
    _write_corpus(given)
    _write_corpus(nowhere_else)  # a good cache must not be used instead: the user named the folder
    good = (given / "val.de.gz").read_bytes()
    bad = _damage(given / "val.de.gz")
    with pytest.raises(Multi30kChecksumError) as error:
        find_multi30k(given, languages=EN_DE, argument="--multi30k_dir")
    for said in (str(given / "val.de.gz"), bad, m.SHA256["val.de.gz"], "replace", "--multi30k_dir"):
        assert said in str(error.value)
    monkeypatch.setenv(m.DATA_ENV, str(given))
    with pytest.raises(Multi30kChecksumError) as error:
        find_multi30k(languages=EN_DE)
    for said in (str(given / "val.de.gz"), bad, "replace", f"unset {m.DATA_ENV}"):
        assert said in str(error.value)
    assert find_multi30k(given, languages=["en"]) == given  # only the requested languages' files are checked
    # a plain file in place of the gzipped one: checked against the decompressed text's checksum
    (given / "val.de.gz").write_bytes(good)
    _gunzip(given, ["val.de.gz"])
    assert find_multi30k(given, languages=EN_DE) == given
    (given / "val.de").write_bytes(gzip.decompress(good)[:-1])
    with pytest.raises(Multi30kChecksumError) as error:
        find_multi30k(given, languages=EN_DE)
    assert str(given / "val.de") in str(error.value) and m.TEXT_SHA256["val.de.gz"] in str(error.value)


def test_a_damaged_copy_beside_the_repository_is_passed_over_with_a_warning(nowhere_else, tmp_path, monkeypatch):
    beside = tmp_path / "beside"
    _write_corpus(beside)
    _write_corpus(nowhere_else)
    monkeypatch.setattr(m, "BESIDE_REPOSITORY", beside)
    bad = _damage(beside / "train.de.gz")
    with pytest.warns(UserWarning, match=rf"train\.de\.gz has SHA-256 {bad}"):
        assert find_multi30k(languages=EN_DE) == nowhere_else


def test_a_verified_file_is_hashed_once_per_size_and_time(nowhere_else, mirror, monkeypatch):
    cache = nowhere_else
    assert find_multi30k(languages=EN_DE) == cache  # downloaded: verified and recorded
    record = cache.parent / "verified-multi30k.json"
    recorded = sorted(str((cache / name).resolve()) for name in m.file_names(EN_DE))
    assert sorted(json.loads(record.read_text())) == recorded
    hashed = []
    file_sha256 = m._file_sha256
    monkeypatch.setattr(m, "_file_sha256", lambda path: hashed.append(path.name) or file_sha256(path))
    assert find_multi30k(languages=EN_DE) == cache and hashed == []
    path = cache / "val.de.gz"  # changed in place, same size: the new time has it hashed again (and found out)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    with pytest.warns(UserWarning, match=r"val\.de\.gz"):
        assert find_multi30k(languages=EN_DE) == cache
    assert hashed == ["val.de.gz"] and path.read_bytes() == data
    # a record that cannot be read or written: every file is hashed, nothing fails
    for broken in ("{not json", "[]"):
        record.write_text(broken)
        hashed.clear()
        assert find_multi30k(languages=EN_DE) == cache and len(hashed) == 6
    assert len(json.loads(record.read_text())) == 6  # rewritten
    record.unlink()
    record.mkdir()
    hashed.clear()
    assert find_multi30k(languages=EN_DE) == cache and len(hashed) == 6
    assert _leftovers(cache.parent) == []


@pytest.mark.parametrize("reply, said", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100, "cut after 100 of 1000 bytes"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n" + b"x" * 100 + b"\r\n3e8\r\n" + b"x" * 50,
     "cut after 100 bytes"),  # http.client raises IncompleteRead, counting the complete chunks
], ids=["content-length", "chunked"])
def test_a_transfer_cut_mid_file_says_so_and_to_retry(nowhere_else, raw_server, monkeypatch, reply, said):
    monkeypatch.setenv(m.URL_ENV, raw_server(reply))
    with pytest.raises(Multi30kNotFoundError) as error:
        find_multi30k(languages=["en"], timeout=5)
    message = str(error.value)
    assert said in message and "retry" in message and "train.en.gz" in message
    assert "broken mirror" not in message and "\n" not in message
    assert _leftovers(nowhere_else) == [] and not (nowhere_else / "train.en.gz").exists()


def test_an_unusable_cache_location_names_it_and_the_other_ways(nowhere_else, tmp_path, monkeypatch, mirror):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    (tmp_path / "xdg" / "hf_headattn").mkdir(parents=True)
    (tmp_path / "xdg" / "hf_headattn" / "multi30k").write_text("")
    for xdg in (in_the_way, in_the_way / "cache", tmp_path / "xdg"):  # a file, a file's child, a file at the cache
        monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
        with pytest.raises(Multi30kNotFoundError) as error:
            find_multi30k(languages=EN_DE)
        message = str(error.value)
        for said in (str(m.cache_dir()), "XDG_CACHE_HOME", "--multi30k_dir", m.DATA_ENV):
            assert said in message


def test_every_failure_is_a_multi30k_error(nowhere_else, raw_server, monkeypatch):
    assert issubclass(m.Multi30kError, OSError) and "Multi30kError" in m.__all__
    assert issubclass(Multi30kNotFoundError, (m.Multi30kError, FileNotFoundError))
    assert issubclass(Multi30kNotFoundError, FileNotFoundError) and issubclass(Multi30kChecksumError, m.Multi30kError)
    for url, said in ((raw_server(b"garbage\r\n\r\n"), "BadStatusLine"), ("not-a-url/", "not-a-url")):
        monkeypatch.setenv(m.URL_ENV, url)  # an answer that is not HTTP (http.client.HTTPException), not a URL
        with pytest.raises(m.Multi30kError, match=rf"downloading train\.en\.gz .*{said}.*Provide it"):
            find_multi30k(languages=["en"], timeout=5)
