"""Deprecated alias of :mod:`hf_headattn.experiment.methods.sea.syntax`, SEA's syntax pipeline (here in releases 0.1
and 0.2), which moved into SEA's kit in 0.3.0: ``hf_headattn.syntax`` and its submodules
(``hf_headattn.syntax.parsing``, ...) still import, as the new modules themselves, with a warning, and go in 0.4."""

from ..deprecation import alias_module

alias_module(__name__, "hf_headattn.experiment.methods.sea.syntax", removed_in="0.4",
             submodules=("alignment", "collator", "dataset", "features", "parsing", "readers"))
