"""Deprecated alias of :mod:`hf_headattn.experiment.recipe_parts`, renamed in 0.3.0 (``recipe``, ``training`` and
``trainer`` were hard to tell apart); importing it warns, and it goes in 0.4."""

import sys
import warnings

from ..version import HeadAttnDeprecationWarning
from . import recipe_parts

warnings.warn("hf_headattn.experiment.training is hf_headattn.experiment.recipe_parts; the old name goes in 0.4",
              HeadAttnDeprecationWarning, stacklevel=2)
sys.modules[__name__] = recipe_parts
