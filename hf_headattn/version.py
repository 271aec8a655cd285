"""The release number, in this one place, and the warning of spellings it deprecates. The number:
``hf_headattn.__version__``, pyproject.toml's version (``[tool.setuptools.dynamic]``) and the ``headattn_version``
every saved config.json records (:mod:`hf_headattn.configuration`; a checkpoint's remote code ships this file with
it)."""

__version__ = "0.3.0"


class HeadAttnDeprecationWarning(FutureWarning):
    """What hf-headattn says of its own deprecated spellings (shown by default, as every ``FutureWarning``)."""
