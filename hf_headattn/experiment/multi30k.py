"""Where the Multi30k data comes from: one resolver for every recipe, the demo, the notebooks and the tests.

Multi30k task 1 (Elliott et al. 2016, "Multi30K: Multilingual English-German Image Descriptions"): the raw files
`{train,val,test_2016_flickr}.{en,de,fr,cs}.gz` of the public repository `multi30k/dataset` (`data/task1/raw/`).

`find_multi30k` looks, in this order, at

1. the folder passed in (`--multi30k_dir`, `multi30k_dir=`);
2. the environment variable `HF_HEADATTN_DATA` (the Multi30k folder, or a folder holding `multi30k/`);
3. `../shared/data/multi30k` beside the repository (a development checkout);
4. the cache, `$XDG_CACHE_HOME/hf_headattn/multi30k` (default `~/.cache/hf_headattn/multi30k`);

and otherwise downloads the files into the cache from `MULTI30K_URL` (`HF_HEADATTN_MULTI30K_URL` names a
mirror laid out as the repository's `data/task1/raw/`), each checked against its pinned SHA-256 before it is
renamed into place, so the cache never holds a partial or altered file.

Every file it returns is checked, wherever it was found: `X.gz` against `SHA256`, a plain `X` in its place
against `TEXT_SHA256` (the decompressed text's), and only the requested languages' files. A file is hashed once
per path, size and modification time: the ones found good are recorded in
`$XDG_CACHE_HOME/hf_headattn/verified-multi30k.json` (written through a temporary file and a rename); a record that
cannot be read or written only means hashing again, never an error. A file that fails the check is never used:

- in a folder the user named (`multi30k_dir`, `HF_HEADATTN_DATA`): `Multi30kChecksumError` naming the
  file, both checksums and the remedy; no fall-through to another copy, since the user chose that folder;
- in `../shared` beside the repository (no one's explicit choice): a warning, then the cache or the download, as
  if that copy were absent (the simpler choice);
- in the cache: a warning, then it is downloaded again (verified); with `download=False`,
  `Multi30kChecksumError`.

Every failure is a `Multi30kError` (an `OSError`) with a one-line message naming the file or place and the
remedy: `Multi30kNotFoundError` (no copy, a failed or cut download, an unusable cache) or
`Multi30kChecksumError` (a damaged file that cannot be replaced).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import tempfile
import urllib.request
import warnings
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from .outputs import write_json_atomic

__all__ = ["DATA_ENV", "LANGUAGES", "MULTI30K_URL", "SHA256", "SPLITS", "TEST_SPLIT", "TEXT_SHA256", "URL_ENV",
           "Multi30kChecksumError", "Multi30kError", "Multi30kNotFoundError", "cache_dir", "fetch_verified",
           "file_names", "find_multi30k"]

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
"""The public repository's raw task-1 files."""
DATA_ENV, URL_ENV = "HF_HEADATTN_DATA", "HF_HEADATTN_MULTI30K_URL"
LANGUAGES = ("en", "de", "fr", "cs")
TEST_SPLIT = "test_2016_flickr"
"""The test set the recipes score (read once, after every choice is made on `validation`)."""
SPLITS = {"train": "train", "validation": "val", TEST_SPLIT: TEST_SPLIT}
"""DatasetDict split name -> file prefix."""
SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}
"""SHA-256 of each file as the public repository serves it."""
TEXT_SHA256 = {
    "train.en.gz": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.de.gz": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.fr.gz": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "train.cs.gz": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "val.en.gz": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.de.gz": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.fr.gz": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
    "val.cs.gz": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "test_2016_flickr.en.gz": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.de.gz": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.fr.gz": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test_2016_flickr.cs.gz": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
}
"""SHA-256 of each file's decompressed text (a plain `train.en` in place of `train.en.gz`), keyed as `SHA256`."""
BESIDE_REPOSITORY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"
"""`../shared/data/multi30k` beside the repository this package was installed from (a development checkout)."""


class Multi30kError(OSError):
    """Multi30k could not be provided (every error of `find_multi30k`; the message names the remedy)."""


class Multi30kNotFoundError(Multi30kError, FileNotFoundError):
    """No copy of Multi30k was found and none could be downloaded (a failed or cut download, an unusable cache)."""


class Multi30kChecksumError(Multi30kError):
    """A file's SHA-256 is not the pinned one and it cannot be replaced (a user's folder, `download=False`, a
    download: nothing is kept)."""


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/hf_headattn/multi30k` (`~/.cache/hf_headattn/multi30k` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_headattn" / "multi30k"


def file_names(languages: Iterable[str] = LANGUAGES) -> list[str]:
    """The gzipped files of every split for `languages`."""
    return [f"{prefix}.{lang}.gz" for prefix in SPLITS.values() for lang in languages]


def _missing(folder: Path, names: list[str]) -> list[str]:
    """The files of `names` that `folder` lacks (a file counts gzipped or not)."""
    return [name for name in names if not (folder / name).is_file() and not (folder / name[:-3]).is_file()]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _record_path() -> Path:
    """The record of the files found good: `$XDG_CACHE_HOME/hf_headattn/verified-multi30k.json`."""
    return cache_dir().parent / "verified-multi30k.json"


def _read_record() -> dict:
    """resolved path -> `[size, mtime_ns, sha256]` of each file found good; empty where unreadable."""
    try:
        record = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(record: dict, paths: dict[Path, str]) -> None:
    """Add `paths` (path -> its pinned SHA-256, found good) to `record` and write it whole or not at all
    (`write_json_atomic`); a cache that cannot hold it only means hashing again next time."""
    with contextlib.suppress(OSError):
        for path, sha256 in paths.items():
            stat = path.stat()
            record[str(path.resolve())] = [stat.st_size, stat.st_mtime_ns, sha256]
        write_json_atomic(_record_path(), record)


def _damaged(folder: Path, names: list[str]) -> list[tuple[str, Path, str]]:
    """`(name, path, "<path> has SHA-256 <actual>, expected <pinned>")` for each file of `names` in `folder`
    (gzipped against `SHA256`, plain against `TEXT_SHA256`) that fails its check; a file without a pin
    (a language Multi30k lacks) is not checked. Files found good are recorded, and a recorded one is not hashed."""
    record, good, damaged = _read_record(), {}, []
    for name in names:
        for path, pins in ((folder / name, SHA256), (folder / name[:-3], TEXT_SHA256)):
            if name not in pins or not path.is_file():
                continue
            try:
                stat = path.stat()
                if record.get(str(path.resolve())) == [stat.st_size, stat.st_mtime_ns, pins[name]]:
                    continue
                actual = _file_sha256(path)
            except OSError as error:
                reason = f"{path} cannot be read ({error}); make it readable, or remove it"
                raise Multi30kNotFoundError(reason) from error
            if actual == pins[name]:
                good[path] = actual
            else:
                damaged.append((name, path, f"{path} has SHA-256 {actual}, expected {pins[name]}"))
    if good:
        _write_record(record, good)
    return damaged


def _checked_folder(folder: Path, names: list[str], origin: str, leave: str) -> Path:
    """`folder` if it holds `names`, each passing its check; a folder given explicitly that does not is an error,
    not a fall-through (`leave`: how to stop using it)."""
    if not folder.is_dir():
        raise Multi30kNotFoundError(f"{origin} {str(folder)!r} is not a folder; expected the Multi30k files "
                                    f"({', '.join(names[:3])}, ...)")
    missing = _missing(folder, names)
    if missing:
        raise Multi30kNotFoundError(f"{origin} {str(folder)!r} lacks {missing}; expected the Multi30k task-1 files")
    damaged = _damaged(folder, names)
    if damaged:
        others = f" (also {[path.name for _, path, _ in damaged[1:]]})" if damaged[1:] else ""
        raise Multi30kChecksumError(f"{origin} {str(folder)!r}: {damaged[0][2]}{others}, a damaged or different copy; "
                                    f"replace it with the public repository's file, or {leave} so that the verified "
                                    f"download into {cache_dir()} is used")
    return folder


def _prepare_cache(cache: Path, damaged: list[Path]) -> None:
    """Create `cache`, check that it takes a file, and remove its `damaged` files; an error names the way out."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
        for path in damaged:
            path.unlink(missing_ok=True)
    except OSError as error:
        raise Multi30kNotFoundError(
            f"Multi30k cannot be downloaded into the cache {str(cache)!r} ({type(error).__name__}: {error}): set "
            f"XDG_CACHE_HOME to a writable folder (the cache is $XDG_CACHE_HOME/hf_headattn/multi30k), or give a "
            f"folder holding the files (--multi30k_dir / multi30k_dir=, or {DATA_ENV})") from error


def find_multi30k(multi30k_dir: str | os.PathLike | None = None, *, languages: Iterable[str] = LANGUAGES,
                  download: bool = True, timeout: float = 30.0, argument: str = "multi30k_dir") -> Path:
    """The folder holding Multi30k's files for `languages`, found or downloaded, each file checked against its
    pinned SHA-256 (order and checks in the module docstring).

    Parameters
    ----------
    multi30k_dir : path, optional
        A folder given by the user; when given, it must hold the files, intact (no fall-through to other places).
    languages : iterable of str
        The languages needed (`"en"`, `"de"`, `"fr"`, `"cs"`); only their files are checked or downloaded.
    download : bool
        Download missing or damaged files into the cache when no intact copy is found.
    timeout : float
        Seconds to wait for the server on each request.
    argument : str
        How the caller names `multi30k_dir` in its messages (a recipe: `"--multi30k_dir"`).

    Raises
    ------
    Multi30kNotFoundError
        A given folder lacks the files, or no copy exists and the download failed or was cut short, or the cache
        cannot be written (the message names the ways to provide the data).
    Multi30kChecksumError
        A file in a given folder, a damaged cached file with `download=False`, or a downloaded file differs from
        its pinned SHA-256 (the message names the file, both checksums and the remedy).

    Warns
    -----
    UserWarning
        A damaged file beside the repository (passed over) or in the cache (downloaded again).
    """
    names = file_names(languages)
    if multi30k_dir is not None:
        return _checked_folder(Path(multi30k_dir), names, argument, f"omit {argument}")
    if os.environ.get(DATA_ENV):
        folder = Path(os.environ[DATA_ENV])
        if _missing(folder, names) and (folder / "multi30k").is_dir():
            folder = folder / "multi30k"
        return _checked_folder(folder, names, DATA_ENV, f"unset {DATA_ENV}")
    if BESIDE_REPOSITORY.is_dir() and not _missing(BESIDE_REPOSITORY, names):
        damaged = _damaged(BESIDE_REPOSITORY, names)
        if not damaged:
            return BESIDE_REPOSITORY
        warnings.warn(f"Multi30k beside the repository is not used: {damaged[0][2]}; the cache or the download is "
                      f"used instead", stacklevel=2)
    cache = cache_dir()
    damaged = _damaged(cache, names)
    absent = set(_missing(cache, names)) | {name for name, _, _ in damaged}
    missing = [name for name in names if name in absent]
    if not missing:
        return cache
    base = os.environ.get(URL_ENV) or MULTI30K_URL
    if damaged and not download:
        raise Multi30kChecksumError(f"the cached {damaged[0][2]}; allow the download (download=True) to replace "
                                    f"it, or remove it")
    if not download:
        raise Multi30kNotFoundError(_how_to_provide(f"no copy of {missing} was found and download=False", base))
    unknown = sorted({name.split(".")[1] for name in missing if name not in SHA256})
    if unknown:
        raise Multi30kNotFoundError(f"Multi30k has no language {unknown} to download; it has {list(LANGUAGES)}")
    for _, _, text in damaged:
        warnings.warn(f"the cached {text}; downloading it again", stacklevel=2)
    _prepare_cache(cache, [path for _, path, _ in damaged])
    for name in missing:
        try:
            fetch_verified(base.rstrip("/") + "/" + name, cache / name, SHA256[name], timeout=timeout)
        except Multi30kChecksumError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as error:  # urllib's errors, a time-out, a bad URL
            detail = error if isinstance(error, OSError) else repr(error)  # repr: one line, names the kind
            reason = f"downloading {name} from {base} failed: {detail}"
            raise Multi30kNotFoundError(_how_to_provide(reason, base)) from error
    _write_record(_read_record(), {cache / name: SHA256[name] for name in missing})
    return cache


def _how_to_provide(reason: str, base: str) -> str:
    return (f"Multi30k is not available: {reason}. Provide it in one of three ways: (1) pass the folder holding "
            f"{{train,val,test_2016_flickr}}.<lang>.gz (--multi30k_dir / multi30k_dir=); (2) set {DATA_ENV} to that "
            f"folder; (3) let it download (network access to {base}, or {URL_ENV} naming a mirror laid out as "
            f"the public repository's data/task1/raw/) into {cache_dir()}.")


def fetch_verified(url: str, destination: Path, sha256: str, *, timeout: float = 30.0) -> Path:
    """Download `url` to `destination` through a temporary file beside it, renamed only once its SHA-256 equals
    `sha256`; on any failure the temporary file is removed and `destination` is untouched. A transfer cut short
    (fewer bytes than the server announced) raises `Multi30kError` saying so, and to retry."""
    partial = destination.with_name(f".{destination.name}.part-{os.getpid()}")
    digest, received, total = hashlib.sha256(), 0, None
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
                total = int(response.headers.get("Content-Length") or 0) or None
                with tqdm(total=total, unit="B", unit_scale=True, desc=destination.name, leave=False) as bar:
                    while chunk := response.read(1 << 16):
                        digest.update(chunk)
                        out.write(chunk)
                        received += len(chunk)
                        bar.update(len(chunk))
        except http.client.IncompleteRead as error:  # the connection closed early (and http.client noticed)
            received += len(error.partial)
            cut = True
        else:
            cut = total is not None and received < total
        if cut:
            of = f" of {total}" if total else ""
            raise Multi30kError(f"the transfer was cut after {received}{of} bytes (the connection closed early; "
                                f"nothing was kept); retry")
        if digest.hexdigest() != sha256:
            raise Multi30kChecksumError(f"{destination.name} from {url} has SHA-256 {digest.hexdigest()}, expected "
                                        f"{sha256}; the file was not kept (a broken mirror or a changed upstream)")
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)
    return destination
