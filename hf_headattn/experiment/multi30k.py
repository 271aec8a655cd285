"""Where the Multi30k data comes from: one resolver for every recipe, the demo, the notebooks and the tests.

Multi30k task 1 (Elliott et al. 2016, "Multi30K: Multilingual English-German Image Descriptions"): the raw files
``{train,val,test_2016_flickr}.{en,de,fr,cs}.gz`` of the public repository ``multi30k/dataset`` (``data/task1/raw/``).

:func:`find_multi30k` looks, in this order, at

1. the folder passed in (``--multi30k_dir``, ``multi30k_dir=``);
2. the environment variable ``HF_HEADATTN_DATA`` (the Multi30k folder, or a folder holding ``multi30k/``);
3. ``../shared/data/multi30k`` beside the repository (a development checkout);
4. the cache, ``$XDG_CACHE_HOME/hf_headattn/multi30k`` (default ``~/.cache/hf_headattn/multi30k``);

and otherwise downloads the files into the cache from :data:`MULTI30K_URL` (``HF_HEADATTN_MULTI30K_URL`` names a
mirror laid out as the repository's ``data/task1/raw/``), each checked against its pinned SHA-256 before it is
renamed into place, so the cache never holds a partial or altered file.
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

#: The public repository's raw task-1 files.
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
DATA_ENV, URL_ENV = "HF_HEADATTN_DATA", "HF_HEADATTN_MULTI30K_URL"
LANGUAGES = ("en", "de", "fr", "cs")
#: The test set the recipes score (read once, after every choice is made on ``validation``).
TEST_SPLIT = "test_2016_flickr"
#: DatasetDict split name -> file prefix.
SPLITS = {"train": "train", "validation": "val", TEST_SPLIT: TEST_SPLIT}
#: SHA-256 of each file as the public repository serves it.
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
#: ``../shared/data/multi30k`` beside the repository this package was installed from (a development checkout).
BESIDE_REPOSITORY = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


class Multi30kNotFoundError(FileNotFoundError):
    """No copy of Multi30k was found and none could be downloaded."""


class Multi30kChecksumError(OSError):
    """A downloaded file's SHA-256 is not the pinned one (nothing is kept)."""


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/hf_headattn/multi30k`` (``~/.cache/hf_headattn/multi30k`` by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_headattn" / "multi30k"


def file_names(languages: Iterable[str] = LANGUAGES) -> list[str]:
    """The gzipped files of every split for ``languages``."""
    return [f"{prefix}.{lang}.gz" for prefix in SPLITS.values() for lang in languages]


def _missing(folder: Path, names: list[str]) -> list[str]:
    """The files of ``names`` that ``folder`` lacks (a file counts gzipped or not)."""
    return [name for name in names if not (folder / name).is_file() and not (folder / name[:-3]).is_file()]


def _checked_folder(folder: Path, names: list[str], origin: str) -> Path:
    """``folder`` if it holds ``names``; a folder given explicitly that does not is an error, not a fall-through."""
    if not folder.is_dir():
        raise Multi30kNotFoundError(f"{origin} {str(folder)!r} is not a folder; expected the Multi30k files "
                                    f"({', '.join(names[:3])}, ...)")
    missing = _missing(folder, names)
    if missing:
        raise Multi30kNotFoundError(f"{origin} {str(folder)!r} lacks {missing}; expected the Multi30k task-1 files")
    return folder


def find_multi30k(multi30k_dir: str | os.PathLike | None = None, *, languages: Iterable[str] = LANGUAGES,
                  download: bool = True, timeout: float = 30.0, argument: str = "multi30k_dir") -> Path:
    """The folder holding Multi30k's files for ``languages``, found or downloaded (order in the module docstring).

    Parameters
    ----------
    multi30k_dir : path, optional
        A folder given by the user; when given, it must hold the files (no fall-through to other places).
    languages : iterable of str
        The languages needed (``"en"``, ``"de"``, ``"fr"``, ``"cs"``); only their files are checked or downloaded.
    download : bool
        Download missing files into the cache when no copy is found.
    timeout : float
        Seconds to wait for the server on each request.
    argument : str
        How the caller names ``multi30k_dir`` in its messages (a recipe: ``"--multi30k_dir"``).

    Raises
    ------
    Multi30kNotFoundError
        A given folder lacks the files, or no copy exists and the download failed (the message names the three ways
        to provide the data).
    Multi30kChecksumError
        A downloaded file differs from its pinned SHA-256 (the message names the file and both checksums).
    """
    names = file_names(languages)
    if multi30k_dir is not None:
        return _checked_folder(Path(multi30k_dir), names, argument)
    if os.environ.get(DATA_ENV):
        folder = Path(os.environ[DATA_ENV])
        if _missing(folder, names) and (folder / "multi30k").is_dir():
            folder = folder / "multi30k"
        return _checked_folder(folder, names, DATA_ENV)
    for folder in (BESIDE_REPOSITORY, cache_dir()):
        if folder.is_dir() and not _missing(folder, names):
            return folder
    cache = cache_dir()
    missing = _missing(cache, names)
    base = os.environ.get(URL_ENV) or MULTI30K_URL
    if not download:
        raise Multi30kNotFoundError(_how_to_provide(f"no copy of {missing} was found and download=False", base))
    unknown = sorted({name.split(".")[1] for name in missing if name not in SHA256})
    if unknown:
        raise Multi30kNotFoundError(f"Multi30k has no language {unknown} to download; it has {list(LANGUAGES)}")
    cache.mkdir(parents=True, exist_ok=True)
    for name in missing:
        try:
            fetch_verified(base.rstrip("/") + "/" + name, cache / name, SHA256[name], timeout=timeout)
        except Multi30kChecksumError:
            raise
        except OSError as error:  # urllib's URLError and HTTPError, a time-out, a refused connection
            reason = f"downloading {name} from {base} failed: {error}"
            raise Multi30kNotFoundError(_how_to_provide(reason, base)) from error
    return cache


def _how_to_provide(reason: str, base: str) -> str:
    return (f"Multi30k is not available: {reason}. Provide it in one of three ways: (1) pass the folder holding "
            f"{{train,val,test_2016_flickr}}.<lang>.gz (--multi30k_dir / multi30k_dir=); (2) set {DATA_ENV} to that "
            f"folder; (3) let it download (network access to {base}, or {URL_ENV} naming a mirror laid out as "
            f"the public repository's data/task1/raw/) into {cache_dir()}.")


def fetch_verified(url: str, destination: Path, sha256: str, *, timeout: float = 30.0) -> Path:
    """Download ``url`` to ``destination`` through a temporary file beside it, renamed only once its SHA-256 equals
    ``sha256``; on any failure the temporary file is removed and ``destination`` is untouched."""
    partial = destination.with_name(f".{destination.name}.part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=destination.name, leave=False) as bar:
                while chunk := response.read(1 << 16):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
        if digest.hexdigest() != sha256:
            raise Multi30kChecksumError(f"{destination.name} from {url} has SHA-256 {digest.hexdigest()}, expected "
                                        f"{sha256}; the file was not kept (a broken mirror or a changed upstream)")
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)
    return destination
