"""The values of the shared syntax inputs (`hf_headattn.syntax_inputs`, the provider) that the methods reading
them check: defined once here, in the model core, so that the provider never imports a method and a method never
imports the provider's pipeline (spaCy, datasets). Plug-ins get them from [`hf_headattn.plugin`][hf_headattn.plugin].
"""

from __future__ import annotations

import typing
from typing import Literal

NOT_IN_PHRASE = -10000
"""`phrase_positions` value for token pairs outside each other's local phrase, and for padding (Zhang et al. 2021,
Figure 3 writes this entry as infinity). A method clips the other values to `[-k, k]` and masks this one."""

Rule2 = Literal["symmetric", "literal"]
"""Readings of the RHE paper's Rule 2 (§4.1.2) for the local phrases: "symmetric" (its symmetric closure, our default)
or "literal" (as printed: only for j < i); see
[`hf_headattn.syntax_inputs.features.local_phrases`][hf_headattn.syntax_inputs.features.local_phrases]. The annotation
of a method's `rule2` setting."""
RULE2 = typing.get_args(Rule2)
"""The readings of [`Rule2`][hf_headattn.phrase_values.Rule2], in its order."""
DEFAULT_RULE2 = "symmetric"
"""The reading the provider uses where no switched-on method sets `rule2`."""
