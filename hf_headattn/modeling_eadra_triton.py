"""The model classes, for a checkpoint whose config chooses EaDRA's Triton pass
(``eadra={"implementation": "triton"}``).

Such a checkpoint's ``auto_map`` names this module instead of :mod:`.modeling` (:mod:`.remote_code`): transformers'
remote code ships, and its loader fetches, the modules the ``auto_map`` module imports relatively, so the checkpoint
carries ``eadra_triton.py``, which :mod:`.eadra_passes` imports by name when the pass runs; other checkpoints do
not. Nothing else imports this module.
"""

from .eadra_triton import available  # noqa: F401  (what the line is for: the checkpoint carries the kernels)
from .modeling import (  # noqa: F401  (the classes auto_map names)
    HeadAttnMarianModel,
    HeadAttnMarianMTModel,
    HeadAttnMBartForConditionalGeneration,
    HeadAttnMBartModel,
)
