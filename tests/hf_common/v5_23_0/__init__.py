"""HF's common model tests of transformers 5.23.0 (written by tests/hf_common/refresh.py, see
../README.md).

Their relative imports (``.generation.test_utils``, ``.exporters.test_export``, ``.utils.test_configuration_utils``)
find the shared stand-ins of ``tests/hf_common/standins``.
"""

from pathlib import Path

__path__.append(str(Path(__file__).resolve().parent.parent / "standins"))
