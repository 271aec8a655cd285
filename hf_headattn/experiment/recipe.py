"""Deprecated alias of :mod:`hf_headattn.experiment.translation_recipe`, renamed in 0.3.0 (``recipe``, ``training`` and
``trainer`` were hard to tell apart); importing it warns, and it goes in 0.4."""

import sys
import warnings

from ..version import HeadAttnDeprecationWarning
from . import translation_recipe

warnings.warn("hf_headattn.experiment.recipe is hf_headattn.experiment.translation_recipe; the old name goes in 0.4",
              HeadAttnDeprecationWarning, stacklevel=2)
sys.modules[__name__] = translation_recipe
