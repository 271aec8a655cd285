"""Vendor HF's common model tests of the installed transformers release (``make hf-common``).

Downloads the release's source distribution (``pip download --no-binary :all: --no-deps transformers==X``), copies
its ``tests/test_modeling_common.py`` and ``tests/test_configuration_common.py`` here unchanged and writes
``VERSION`` (the release and the files' sha256), which ``tests/test_hf_common.py`` reads: those tests run only on
that release. Then run ``make test`` and update ``SKIPS`` in tests/test_hf_common.py for what the new release adds.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("test_modeling_common.py", "test_configuration_common.py")


def refresh(version: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "--no-build-isolation", "-d", tmp, f"transformers=={version}"], check=True)
        (sdist,) = Path(tmp).glob("transformers-*.tar.gz")
        with tarfile.open(sdist) as archive:
            for name in FILES:
                member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/tests/{name}")
                if member is None:
                    raise SystemExit(f"{sdist.name} has no tests/{name}")
                (HERE / name).write_bytes(member.read())
    lines = [version] + [f"{hashlib.sha256((HERE / name).read_bytes()).hexdigest()}  {name}" for name in FILES]
    (HERE / "VERSION").write_text("\n".join(lines) + "\n")
    print(f"tests/hf_common: HF's common tests of transformers {version}")


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=transformers.__version__,
                        help="transformers release (default: the installed one, %(default)s)")
    refresh(parser.parse_args().version)


if __name__ == "__main__":
    main()
