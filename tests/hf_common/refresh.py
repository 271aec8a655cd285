"""Vendor HF's common model tests of the installed transformers release (``make hf-common``: the release of
``.venv-newest``).

Downloads the release's source distribution (``pip download --no-binary :all: --no-deps transformers==X``), copies
its ``tests/test_modeling_common.py`` and ``tests/test_configuration_common.py`` unchanged into a folder of their own,
``v<release, dots as underscores>/`` (e.g. ``v5_24_0/``), with ``VERSION`` (the release and the files' sha256) and
the ``__init__.py`` that finds the shared stand-ins (``standins/``). ``tests/test_hf_common.py`` runs the folder of
the installed release. Then run ``make test-newest`` and update ``skips``/``EXPECTED_WARNINGS`` in
tests/test_hf_common.py for what the new release adds (README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("test_modeling_common.py", "test_configuration_common.py")
INIT = '''"""HF's common model tests of transformers {version} (written by tests/hf_common/refresh.py, see
../README.md).

Their relative imports (``.generation.test_utils``, ``.exporters.test_export``, ``.utils.test_configuration_utils``)
find the shared stand-ins of ``tests/hf_common/standins``.
"""

from pathlib import Path

__path__.append(str(Path(__file__).resolve().parent.parent / "standins"))
'''


def folder_name(version: str) -> str:
    """The package holding a release's files: ``5.24.0`` -> ``v5_24_0``."""
    return "v" + re.sub(r"\W", "_", version)


def vendored() -> dict[str, Path]:
    """``{release: folder}`` of the releases vendored here."""
    return {(path / "VERSION").read_text().split()[0]: path for path in sorted(HERE.glob("v*/")) if
            (path / "VERSION").is_file()}


def refresh(version: str) -> Path:
    folder = HERE / folder_name(version)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "--no-build-isolation", "-d", tmp, f"transformers=={version}"], check=True)
        (sdist,) = Path(tmp).glob("transformers-*.tar.gz")
        with tarfile.open(sdist) as archive:
            contents = {}
            for name in FILES:
                member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/tests/{name}")
                if member is None:
                    raise SystemExit(f"{sdist.name} has no tests/{name}")
                contents[name] = member.read()
    folder.mkdir(exist_ok=True)
    for name, content in contents.items():
        (folder / name).write_bytes(content)
    (folder / "__init__.py").write_text(INIT.format(version=version))
    lines = [version] + [f"{hashlib.sha256(contents[name]).hexdigest()}  {name}" for name in FILES]
    (folder / "VERSION").write_text("\n".join(lines) + "\n")
    print(f"tests/hf_common/{folder.name}: HF's common tests of transformers {version}")
    others = sorted(set(vendored()) - {version})
    if others:
        print(f"also vendored: {', '.join(others)} (remove a folder that neither end of the range installs any more)")
    return folder


def main() -> None:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=transformers.__version__,
                        help="transformers release (default: the installed one, %(default)s)")
    refresh(parser.parse_args().version)


if __name__ == "__main__":
    main()
