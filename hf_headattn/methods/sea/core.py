"""SEA + RHE: syntax-enhanced attention on redundant heads (Zhang et al. 2021, §3.0.2, §4, Eq. 3-10).

Variants (Tables 1-2), on the encoder self-attention of `sea["encoder_layers"]` (default the first layer, Appendix
A.2):

* `sea={"type": "dea" | "lpea", "head_selection": "all"}`: +DEA (Eq. 4-5) / +LPEA (Eq. 6-8) on every head;
* `"head_selection": "redundant"` (default): +DEA+RHE / +LPEA+RHE, only on the heads Eq. 10 finds redundant, per
  sentence;
* `sea={"type": None, "prune": True}`: RHE pruning, the redundant heads' outputs are zeroed.

Inputs (named forward arguments, from `DataCollatorForSyntaxSeq2Seq` of SEA's kit,
`hf_headattn.syntax_inputs`; only the SEA module reads them, so the decoder and cross-attention
ignore them; `generate()` passes them to the encoder and expands them for beams): `dependency_mask` (B, S, S) bool,
needed by DEA and by every RHE variant (Eq. 9 reads it, LPEA+RHE included); `phrase_positions` (B, S, S) integer,
needed by LPEA. Label rule: a value is either `NOT_IN_PHRASE` (outside the local phrase) or a relative phrasal
position with |RP| < |NOT_IN_PHRASE|, clipped to [-k, k] (Eq. 7); anything else raises. The math is in
`hf_headattn.methods.sea.equations`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ...attention import AttentionCall, AttentionMethod, constant
from ...hf_compat import assert_async, init_normal_, init_zeros_
from ...losses import IGNORE_INDEX
from ...phrase_values import (
    DEFAULT_RULE2,
    NOT_IN_PHRASE,
    RULE2,  # noqa: F401  (its home until #65; release 0.2's hf_headattn.sea.RULE2)
    Rule2,
)
from ...placement import layers_of, renamed
from ...redundancy import dependency_allowed, redundant_heads_of
from ...registry import MethodSettings, MethodSpec
from .equations import (
    lpea_bias,
    lpea_label_bias,
)

NAME = "sea"
CHECKED = "sea_inputs_checked"  # context record: the inputs of this forward were validated


@dataclass(frozen=True)
class SEASettings(MethodSettings):
    """SEA + RHE's settings (`config.sea`).

    - `type`: None (RHE pruning only), "dea" or "lpea". head_selection: "all" or "redundant" (RHE). encoder_layers: the
    encoder layers ("all", layer numbers, None: none; default `[0]`, the first, Appendix A.2). prune: drop the
    redundant heads' outputs instead (RHE pruning, needs type None).
    - `max_relative_position`: k of Eq. 7. rule2: Rule 2 of the relative phrasal positions, "symmetric" (our reading) or
    "literal" (as written, j < i); the syntax pipeline builds `phrase_positions` with it.
    """

    type: Literal["dea", "lpea"] | None = None
    head_selection: Literal["all", "redundant"] = "redundant"
    encoder_layers: list[int] | Literal["all"] | None = field(default_factory=lambda: [0])
    prune: bool = False
    max_relative_position: int = 6
    rule2: Rule2 = DEFAULT_RULE2

    def validate(self, config, name: str) -> None:
        layers(self, config, name)
        if self.prune and self.type is not None:
            raise ValueError(
                f"{name}.prune=True drops the redundant heads, so it cannot also enhance them with {name}.type="
                f"{self.type!r}; set type=None for RHE pruning"
            )
        if self.max_relative_position < 1:
            raise ValueError(f"{name}.max_relative_position must be a positive integer, got "
                             f"{self.max_relative_position!r}")

    def switched_on(self) -> bool:
        return self.type is not None or self.prune


def layers(settings: SEASettings, config, name: str = NAME) -> list[int]:
    """The enhanced encoder layers: `settings.encoder_layers`, by default the first (Appendix A.2)."""
    return layers_of(settings.encoder_layers, config.encoder_layers, f"{name}.encoder_layers")


def older_spellings(values) -> tuple[dict, list]:
    """Release 0.2's `layers` (None: the first layer) and `heads` (a head mode) as `encoder_layers` and
    `head_selection` (`MethodSpec.older_spellings`)."""
    notes = []
    values = renamed(values, "layers", "encoder_layers", lambda value: [0] if value is None else value, notes)
    return renamed(values, "heads", "head_selection", notes=notes), notes


def neutral_inputs(batch_size: int, length: int) -> dict[str, torch.Tensor]:
    """SEA inputs that change nothing: every pair related (no head is redundant by Eq. 10, since all the attention
    mass is syntactic; DEA keeps every key) and phrase position 0 everywhere (LPEA adds one constant to a whole row,
    which softmax ignores)."""
    return {"dependency_mask": torch.ones(batch_size, length, length, dtype=torch.bool),
            "phrase_positions": torch.zeros(batch_size, length, length, dtype=torch.long)}


def placements(settings: SEASettings, config) -> list[tuple[str, int, str]]:
    return [("encoder", layer, "self") for layer in layers(settings, config)]


# --- inputs ------------------------------------------------------------------------------------------------------

_HOW = ("build batches with hf_headattn.syntax_inputs.DataCollatorForSyntaxSeq2Seq (after "
        "add_syntax_features), or pass it yourself: model(..., {name}=...) or model.generate(..., {name}=...)")


def needed_inputs(settings: SEASettings, readout: bool = False) -> tuple[str, ...]:
    """The forward arguments SEA needs with these settings (`readout`: `output_redundant_heads=True`).

    RHE's Eq. 9 reads the dependency mask, so every RHE variant (`sea["head_selection"] = "redundant"`,
    `sea["prune"]`, the read-out) needs `dependency_mask`, LPEA+RHE included; LPEA needs `phrase_positions`.
    """
    needed = []
    if settings.type == "dea" or settings.prune or settings.head_selection == "redundant" or readout:
        needed.append("dependency_mask")
    if settings.type == "lpea":
        needed.append("phrase_positions")
    return tuple(needed)


VALID_BOUNDS = (NOT_IN_PHRASE, IGNORE_INDEX, IGNORE_INDEX + 1, -NOT_IN_PHRASE)
"""`torch.bucketize(phrase_positions, VALID_BOUNDS, right=True)` is odd exactly at the valid values: 1 from
NOT_IN_PHRASE to IGNORE_INDEX - 1, 3 from IGNORE_INDEX + 1 to -NOT_IN_PHRASE - 1; 0, 2 (IGNORE_INDEX) and 4 are
invalid."""


def valid_phrase_positions(tensor: torch.Tensor) -> torch.Tensor:
    """Nonzero where a `phrase_positions` value is valid (NOT_IN_PHRASE, or |RP| < |NOT_IN_PHRASE| but not
    IGNORE_INDEX): eagerly the odd buckets of `VALID_BOUNDS` (2 operators over (B, S, S), for 5 comparisons), compiled
    the comparisons, which Inductor fuses into one kernel (`bucketize` is a library call there on the CPU)."""
    if torch.compiler.is_compiling():
        return (tensor >= NOT_IN_PHRASE) & (tensor <= -NOT_IN_PHRASE - 1) & (tensor != IGNORE_INDEX)
    return torch.bucketize(tensor, constant(VALID_BOUNDS, torch.long, tensor.device), right=True).bitwise_and(1)


def _checks_on_host(tensor: torch.Tensor) -> bool:
    """Whether a value check may read `tensor` on the host: on the CPU (free there), not when compiled."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def check_input(name: str, tensor, query: torch.Tensor, k: int) -> None:
    """Raise `ValueError` unless `tensor` is a valid `dependency_mask`/`phrase_positions` for this call.

    Expected: shape (batch, src_len, src_len) of the batch being encoded, on the query's device; `dependency_mask`
    torch.bool; `phrase_positions` an integer dtype whose values are `NOT_IN_PHRASE` or relative positions with
    `|RP| < |NOT_IN_PHRASE|` (clipped to [-k, k] by Eq. 7). Any other value (e.g. -10001, 10000) is a mix-up of
    sentinels, not a phrase position, and raises; so does -100, the label padding value (`IGNORE_INDEX`), which
    would otherwise be clipped to -k silently (a layer difference of 100 needs a phrase tree over 100 levels deep). On
    an accelerator, or compiled, the value checks are device-side assertions, so that no check ever synchronises the
    host with the device.
    """
    if tensor is None:
        raise ValueError(f"SEA needs the forward argument {name} (batch, src_len, src_len); " + _HOW.format(name=name))
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    expected = (query.shape[0], query.shape[2], query.shape[2])
    if tuple(tensor.shape) != expected:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}, expected (batch, src_len, src_len) = {expected} to match "
            f"input_ids of shape {expected[:2]}; " + _HOW.format(name=name)
        )
    if tensor.device != query.device:
        raise ValueError(
            f"{name} is on {tensor.device} but the model runs on {query.device}; move it with {name}.to(model.device)"
        )
    if name == "dependency_mask":
        if tensor.dtype != torch.bool:
            raise ValueError(f"dependency_mask must be torch.bool (True = related or i == j), got {tensor.dtype}")
        return
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"phrase_positions must be an integer tensor (torch.long), got {tensor.dtype}")
    valid = valid_phrase_positions(tensor)
    expected = (f"expected relative phrasal positions with |RP| < {abs(NOT_IN_PHRASE)} (clipped to [-{k}, {k}]) or "
                f"NOT_IN_PHRASE = {NOT_IN_PHRASE} outside the local phrase and on padding, as "
                "DataCollatorForSyntaxSeq2Seq writes it")
    if not _checks_on_host(tensor):  # no host-device synchronisation, no graph break
        assert_async(valid.all(), f"phrase_positions contains an invalid value: {expected}")
    elif not valid.all():
        value = tensor[~valid.bool()][0].item()
        padding = f" (the label padding value {IGNORE_INDEX}: padded like labels?)" if value == IGNORE_INDEX else ""
        raise ValueError(f"phrase_positions contains {value}{padding}: {expected}")


# --- the module attached to the attention module ------------------------------------------------------------------


class SEA(AttentionMethod):
    """SEA (DEA Eq. 4-5 or LPEA Eq. 6-8) on all heads or, with RHE (Eq. 3, 9, 10), on the redundant heads only.

    `before` identifies the redundant heads from the layer's plain attention probabilities (softmax of q k^T *
    scaling with the padding mask, no attention dropout; computed only when needed) and adds the SEA mask (Eq. 5's
    hard mask, LPEA's bias P) to the scores of the selected heads, per sentence and head
    (`call.add_score_bias`: the shared layer makes it the backend's mask, or flex's `score_mod`); `after` zeroes
    the redundant heads' outputs for RHE pruning.

    What gets gradients: the RHE statistics are computed under `no_grad` and Eq. 10 is a hard decision, so the
    selection gets none (no straight-through estimator; the paper gives none). Gradients flow as in any attention
    through the SEA-modified attention of the selected heads (q, k, v) and, for LPEA, into the `lpea_*` parameters
    through the bias (the backends differentiate the float mask). Pruned heads get no gradient from this layer's
    output.

    LPEA parameters (`d_h` the head dimension, shared by the heads of the layer): `lpea_embeddings` w_-k..w_k
    (2k+1, d_h) ~ N(0, 1) like `nn.Embedding`; `lpea_weight` W_P (d_h, d_h) ~ N(0, std); `lpea_bias` b_P = 0;
    `lpea_projection` U_P (d_h,) ~ N(0, std).

    On flex attention the SEA mask is a `score_mod` over the sentence's positions and its selected heads
    (`biased_score_mod`), the padding staying in transformers' block mask: no (B, H, T, S) tensor.
    """

    def __init__(self, settings: SEASettings, head_dim: int):
        super().__init__()
        self.settings = settings
        self.k = settings.max_relative_position
        if self.settings.type == "lpea":
            self.lpea_embeddings = nn.Parameter(torch.empty(2 * self.k + 1, head_dim))
            self.lpea_weight = nn.Parameter(torch.empty(head_dim, head_dim))
            self.lpea_bias = nn.Parameter(torch.empty(head_dim))
            self.lpea_projection = nn.Parameter(torch.empty(head_dim))

    def init_weights(self, std: float) -> None:
        if self.settings.type == "lpea":
            init_normal_(self.lpea_embeddings, std=1.0)
            init_normal_(self.lpea_weight, std=std)
            init_zeros_(self.lpea_bias)
            init_normal_(self.lpea_projection, std=std)

    def label_bias(self) -> torch.Tensor:
        """Eq. 8 for the 2k+1 labels: (2k+1,), in the parameters' dtype, outside autocast: 2k+1 rows of d_h, whose
        casts under autocast (11 operators forward and backward, each a kernel launch) cost more than the math."""
        with torch.autocast(self.lpea_weight.device.type, enabled=False):
            return lpea_label_bias(self.lpea_embeddings, self.lpea_weight, self.lpea_bias, self.lpea_projection)

    def before(self, call: AttentionCall) -> None:
        """Check the inputs, find the redundant heads when needed (kept in `call.state` for `after`
        and recorded for `output_redundant_heads`), and add the SEA mask to the selected heads' scores: Eq. 5's
        allowed pairs (DEA), with LPEA's bias P (Eq. 6). A row whose allowed keys are all padding keeps the padding
        mask alone (the shared layer's rule, `hf_headattn.scores`)."""
        readout = call.context is not None and "output_redundant_heads" in call.context.flags
        inputs = {name: call.kwargs.get(name) for name in needed_inputs(self.settings, readout)}
        context = call.context
        if context is None or not context.has(CHECKED):  # once per forward, not once per SEA layer
            for name, tensor in inputs.items():
                check_input(name, tensor, call.query, self.k)
            if context is not None:
                context.record(CHECKED, True)
        if self.settings.prune or self.settings.head_selection == "redundant" or readout:
            call.state["sea_redundant"] = redundant_heads_of(call, inputs["dependency_mask"])
            if readout:
                call.context.record("redundant_heads", (call.module.headattn_name, call.state["sea_redundant"]))
        if self.settings.type is None:
            return
        if self.settings.type == "dea":
            bias, allowed = None, dependency_allowed(inputs["dependency_mask"])
        else:
            # (cast to the query's dtype before the gather: 2k+1 values, not the gathered (B, S, S) bias)
            bias, allowed = lpea_bias(inputs["phrase_positions"], self.label_bias().to(call.query.dtype), NOT_IN_PHRASE)
            bias = bias[:, None]  # (B, 1, T, S)
        selected = call.state["sea_redundant"] if self.settings.head_selection == "redundant" else None
        call.add_score_bias(bias, allowed=allowed[:, None], heads=selected)

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        if not self.settings.prune:
            return attn_output
        keep = ~call.state["sea_redundant"]  # (B, H)
        return attn_output * keep[:, None, :, None].to(attn_output.dtype)  # (B, T, H, D)


def build(settings: SEASettings, config, module) -> SEA:
    return SEA(settings, module.head_dim)


def collect(context, settings: SEASettings) -> tuple[dict, None]:
    """`redundant_heads`: {module name: (batch, heads) bool} when asked for; SEA adds no objective term."""
    if "output_redundant_heads" not in context.flags or not context.recorded("redundant_heads"):
        return {}, None
    return {"redundant_heads": dict(context.recorded("redundant_heads"))}, None


METHOD = MethodSpec(
    NAME, SEASettings, placements, build, collect,
    runs_before=("dhicm",),  # RHE pruning zeroes per-head outputs, which DHICM's paper mode mixes into one
    inputs=("dependency_mask", "phrase_positions"), neutral_inputs=neutral_inputs,
    flags=("output_redundant_heads",),
    outputs={"redundant_heads": "{module name: (batch, heads) bool}, with output_redundant_heads=True"},
    older_spellings=older_spellings,
    legacy_fields={"sea_type": "type", "sea_heads": "heads", "sea_layers": "layers", "rhe_prune": "prune",
                   "lpea_max_relative_position": "max_relative_position", "lpea_rule2": "rule2"},
    kit="hf_headattn.methods.sea.kit",
)
