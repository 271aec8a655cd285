"""Deprecated alias of :mod:`hf_headattn.experiment.translation_recipe` (release 0.2's name, renamed in 0.3.0:
``recipe``, ``training`` and ``trainer`` were hard to tell apart); importing it warns, and it goes in 0.4."""

from ..deprecation import NEXT_RELEASE, alias_module

alias_module(__name__, "hf_headattn.experiment.translation_recipe", removed_in=NEXT_RELEASE)
