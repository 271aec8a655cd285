"""SEA + RHE: syntax-enhanced attention on redundant heads (Zhang et al. 2021, §3.0.2, §4, Eq. 3-10).

Variants (Tables 1-2), on the encoder self-attention of ``sea_layers`` (default the first layer, Appendix A.2):

* ``sea_type="dea"`` / ``"lpea"``, ``sea_heads="all"``: +DEA (Eq. 4-5) / +LPEA (Eq. 6-8) on every head;
* ``sea_heads="redundant"`` (default): +DEA+RHE / +LPEA+RHE, only on the heads Eq. 10 finds redundant, per sentence;
* ``sea_type=None, rhe_prune=True``: RHE pruning, the redundant heads' outputs are zeroed.

Inputs (named forward arguments, from :class:`hf_headattn.syntax.DataCollatorForSyntaxSeq2Seq`; only the SEA
module reads them, so the decoder and cross-attention ignore them; ``generate()`` passes them to the encoder and
expands them for beams): ``dependency_mask`` (B, S, S) bool, needed by DEA and by every RHE variant (Eq. 9 reads
it, LPEA+RHE included); ``phrase_positions`` (B, S, S) integer, needed by LPEA. Label rule: a value is either
``NOT_IN_PHRASE`` (outside the local phrase) or a relative phrasal position with |RP| < |NOT_IN_PHRASE|, clipped
to [-k, k] (Eq. 7); anything else raises. The math is in :mod:`hf_headattn.sea_math`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import initialization as init

from .attention import AttentionCall, AttentionMethod, MethodSpec
from .sea_math import (
    NOT_IN_PHRASE,
    dependency_allowed,
    enhanced_mask,
    head_confidence,
    key_allowed,
    lpea_bias,
    lpea_label_bias,
    plain_probabilities,
    real_tokens,
    redundant_heads,
    syntactic_attention,
)
from .settings_checks import check_choice, resolve_layers

NAME = "sea"
SEA_TYPES = (None, "dea", "lpea")
SEA_HEADS = ("all", "redundant")


def layers(config) -> list[int]:
    """The enhanced encoder layers: ``sea_layers``, by default the first (Appendix A.2)."""
    return resolve_layers([0] if config.sea_layers is None else config.sea_layers, config.encoder_layers, "sea_layers")


def check_settings(config) -> None:
    check_choice(config.sea_type, "sea_type", SEA_TYPES)
    check_choice(config.sea_heads, "sea_heads", SEA_HEADS)
    layers(config)
    if config.rhe_prune and config.sea_type is not None:
        raise ValueError(
            f"rhe_prune=True drops the redundant heads, so it cannot also enhance them with sea_type="
            f"{config.sea_type!r}; set sea_type=None for RHE pruning"
        )
    k = config.lpea_max_relative_position
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"lpea_max_relative_position must be a positive integer, got {k!r}")


def enabled(config) -> bool:
    return config.sea_type is not None or config.rhe_prune


def placements(config) -> list[tuple[str, int, str]]:
    return [("encoder", layer, "self") for layer in layers(config)] if enabled(config) else []


# --- inputs ------------------------------------------------------------------------------------------------------

_HOW = ("build batches with hf_headattn.syntax.DataCollatorForSyntaxSeq2Seq (after add_syntax_features), or pass "
        "it yourself: model(..., {name}=...) or model.generate(..., {name}=...)")


def needed_inputs(config, readout: bool = False) -> tuple[str, ...]:
    """The forward arguments SEA needs with these settings (``readout``: ``output_redundant_heads=True``).

    RHE's Eq. 9 reads the dependency mask, so every RHE variant (``sea_heads="redundant"``, ``rhe_prune``, the
    read-out) needs ``dependency_mask``, LPEA+RHE included; LPEA needs ``phrase_positions``.
    """
    needed = []
    if config.sea_type == "dea" or config.rhe_prune or config.sea_heads == "redundant" or readout:
        needed.append("dependency_mask")
    if config.sea_type == "lpea":
        needed.append("phrase_positions")
    return tuple(needed)


def check_input(name: str, tensor, query: torch.Tensor, k: int) -> None:
    """Raise ``ValueError`` unless ``tensor`` is a valid ``dependency_mask``/``phrase_positions`` for this call.

    Expected: shape (batch, src_len, src_len) of the batch being encoded, on the query's device; ``dependency_mask``
    torch.bool; ``phrase_positions`` an integer dtype whose values are ``NOT_IN_PHRASE`` or relative positions with
    ``|RP| < |NOT_IN_PHRASE|`` (clipped to [-k, k] by Eq. 7). Any other value (e.g. -10001, 10000) is a mix-up of
    sentinels, not a phrase position, and raises.
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
    bad = (tensor != NOT_IN_PHRASE) & (tensor.abs() >= abs(NOT_IN_PHRASE))
    if bad.any():
        value = tensor[bad][0].item()
        raise ValueError(
            f"phrase_positions contains {value}: expected relative phrasal positions with |RP| < {abs(NOT_IN_PHRASE)} "
            f"(clipped to [-{k}, {k}]) or NOT_IN_PHRASE = {NOT_IN_PHRASE} outside the local phrase"
        )


# --- the module attached to the attention module ------------------------------------------------------------------


class SEA(AttentionMethod):
    """SEA (DEA Eq. 4-5 or LPEA Eq. 6-8) on all heads or, with RHE (Eq. 3, 9, 10), on the redundant heads only.

    ``before`` identifies the redundant heads from the layer's plain attention probabilities (softmax of q k^T *
    scaling with the padding mask, no attention dropout; computed only when needed) and replaces the mask with the additive SEA mask on
    the selected heads (per sentence and head), which the model's backend (SDPA, eager) applies; ``after`` zeroes
    the redundant heads' outputs for RHE pruning.

    What gets gradients: the RHE statistics are computed under ``no_grad`` and Eq. 10 is a hard decision, so the
    selection gets none (no straight-through estimator; the paper gives none). Gradients flow as in any attention
    through the SEA-modified attention of the selected heads (q, k, v) and, for LPEA, into the ``lpea_*`` parameters
    through the bias (the backends differentiate the float mask). Pruned heads get no gradient from this layer's
    output.

    LPEA parameters (``d_h`` the head dimension, shared by the heads of the layer): ``lpea_embeddings`` w_-k..w_k
    (2k+1, d_h) ~ N(0, 1) like ``nn.Embedding``; ``lpea_weight`` W_P (d_h, d_h) ~ N(0, std); ``lpea_bias`` b_P = 0;
    ``lpea_projection`` U_P (d_h,) ~ N(0, std).
    """

    def __init__(self, sea_type: str | None, sea_heads: str, rhe_prune: bool, head_dim: int, k: int):
        super().__init__()
        self.sea_type, self.sea_heads, self.rhe_prune, self.k = sea_type, sea_heads, rhe_prune, k
        if sea_type == "lpea":
            self.lpea_embeddings = nn.Parameter(torch.empty(2 * k + 1, head_dim))
            self.lpea_weight = nn.Parameter(torch.empty(head_dim, head_dim))
            self.lpea_bias = nn.Parameter(torch.empty(head_dim))
            self.lpea_projection = nn.Parameter(torch.empty(head_dim))

    def init_weights(self, std: float) -> None:
        if self.sea_type == "lpea":
            init.normal_(self.lpea_embeddings, std=1.0)
            init.normal_(self.lpea_weight, std=std)
            init.zeros_(self.lpea_bias)
            init.normal_(self.lpea_projection, std=std)

    def label_bias(self) -> torch.Tensor:
        """Eq. 8 for the 2k+1 labels: (2k+1,)."""
        return lpea_label_bias(self.lpea_embeddings, self.lpea_weight, self.lpea_bias, self.lpea_projection)

    def before(self, call: AttentionCall) -> None:
        """Check the inputs, find the redundant heads when needed (kept in ``call.state`` for ``after``
        and recorded for ``output_redundant_heads``), and give the backend the SEA mask."""
        readout = call.context is not None and call.context.output_redundant_heads
        inputs = {name: call.kwargs.get(name) for name in needed_inputs(self, readout)}
        for name, tensor in inputs.items():
            check_input(name, tensor, call.query, self.k)
        if self.rhe_prune or self.sea_heads == "redundant" or readout:
            call.state["sea_redundant"] = self._redundant(call, inputs["dependency_mask"])
            if readout:
                call.context.record("redundant_heads", (call.module.headattn_name, call.state["sea_redundant"]))
        if self.sea_type is None:
            return
        if self.sea_type == "dea":
            allowed = dependency_allowed(inputs["dependency_mask"])
            bias = torch.zeros((), dtype=call.query.dtype, device=call.query.device).expand(allowed.shape)
        else:
            bias, allowed = lpea_bias(inputs["phrase_positions"], self.label_bias(), NOT_IN_PHRASE)
        selected = call.state["sea_redundant"] if self.sea_heads == "redundant" else None
        call.attention_mask = enhanced_mask(call.attention_mask, bias, allowed, selected, call.query.dtype)

    @torch.no_grad()
    def _redundant(self, call: AttentionCall, dependency_mask: torch.Tensor) -> torch.Tensor:
        """Eq. 3, 9, 10 on the plain attention of this call: (B, H) bool, True = redundant."""
        length = call.key.shape[2]
        allowed = key_allowed(call.attention_mask, length)  # None or (B, 1, T, S)
        real = real_tokens(allowed, call.key.shape[0], length, call.key.device)  # (B, S) = (B, T)
        probs = plain_probabilities(call.query, call.key, call.scaling, allowed)  # (B, H, T, S)
        return redundant_heads(head_confidence(probs, real), syntactic_attention(probs, dependency_mask, real))

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        if not self.rhe_prune:
            return attn_output
        keep = ~call.state["sea_redundant"]  # (B, H)
        return attn_output * keep[:, None, :, None].to(attn_output.dtype)  # (B, T, H, D)


def build(config, module) -> SEA:
    return SEA(config.sea_type, config.sea_heads, config.rhe_prune, module.head_dim,
               config.lpea_max_relative_position)


def collect(context, config) -> tuple[dict, None]:
    """``redundant_heads``: {module name: (batch, heads) bool} when asked for; SEA adds no objective term."""
    if not context.output_redundant_heads or not context.records.get("redundant_heads"):
        return {}, None
    return {"redundant_heads": dict(context.records["redundant_heads"])}, None


METHOD = MethodSpec(NAME, check_settings, placements, build, collect)
