"""Deprecated alias of :mod:`hf_headattn.experiment.methods.sea.syntax`, SEA's syntax pipeline, which moved into SEA's
kit in 0.3.0; ``hf_headattn.syntax`` and its submodules (``hf_headattn.syntax.parsing``, ...) still import, with a
``HeadAttnDeprecationWarning``, and go in 0.4."""

import importlib
import sys
import warnings

from ..version import HeadAttnDeprecationWarning
from ..experiment.methods.sea import syntax as _moved
from ..experiment.methods.sea.syntax import *  # noqa: F401,F403
from ..experiment.methods.sea.syntax import __all__  # noqa: F401

for _name in ("alignment", "collator", "dataset", "features", "parsing", "readers"):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"{_moved.__name__}.{_name}")

warnings.warn("hf_headattn.syntax moved to hf_headattn.experiment.methods.sea.syntax (SEA's kit); the old name goes in "
              "0.4", HeadAttnDeprecationWarning, stacklevel=2)
