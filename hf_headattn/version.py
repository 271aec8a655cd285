"""The release number, in this one place: `hf_headattn.__version__`, pyproject.toml's version
(`[tool.setuptools.dynamic]`) and the `headattn_version` every saved config.json records
([`hf_headattn.configuration`][hf_headattn.configuration]; a checkpoint's remote code ships this file with it)."""

__version__ = "0.3.0"
