"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018) on self-attention, optionally only on the heads
RHE finds redundant (Zhang et al. 2021, Table 2's Rel_Pos + RHE).

`rel_pos={"max_relative_position": 16}` adds, on the self-attention of `encoder_layers` (default `"all"`) and
`decoder_layers` (default None: none), Eq. 4's key term to the scores and Eq. 3's value term to the output:
e_ij = q_i (k_j + w^K_{clip(j-i, k)})^T / sqrt(d), z_i = sum_j alpha_ij (v_j + w^V_{clip(j-i, k)}), with learned
tables w^K, w^V of (2k+1, d_head) per layer and per head (`tables="head"`: the paper's base model, §4.1), or per
layer, shared by its heads (`tables="layer"`: its big model, §4.1, with k = 8). `absolute_positions=False` (the
compared model of §4.2 has no absolute position encodings) mutes the position embeddings of the stacks the method is
placed on ([`mute_position_embeddings`][hf_headattn.model_hooks.mute_position_embeddings], through
`MethodSpec.prepare_stack`). The math is in `hf_headattn.methods.rel_pos.equations`; no (T, S, d) tensor is made.

How it runs (`before`): the key term, q @ W^K^T gathered by the relative labels, is a score bias
(`call.add_score_bias`), so with `values=False` SDPA keeps its fast path; the value term needs the probabilities,
so with `values=True` (the paper) the method takes over every head of the layer (`call.take_over`). With
`head_selection="all"` and no attention dropout its `attend` gets the call's mask with the other methods' score
biases in it and runs both terms in one autograd Function (`relative_attention`: the key term gathered
with the mask in one write, alpha kept, no other (B, H, T, S) tensor); otherwise the key term is a score bias in that
mask and `attend` computes alpha, alpha @ V and the per-label sums of alpha times W^V.

`head_selection="redundant"`: the terms apply only to the heads RHE (Eq. 3, 9, 10;
`redundant_heads_of`, shared with SEA) marks redundant in each sentence; it reads the forward
input `dependency_mask` (B, S, S) bool.
The key term goes to those sentence-heads through `add_score_bias(heads=(B, H) selection)`; the value term is
computed for every head and added where selected (one take-over of all heads, rather than a take-over per selection,
which `take_over`'s fixed head numbers cannot express): the unselected sentence-heads get plain attention.
Refused on decoder layers (RHE needs the source's parse).

Positions: the call's (`hf_headattn.positions`): without a cache the queries are the keys; with a key-value
cache in generation, dynamic or static (whose keys include slots not yet filled), the new queries sit after the cached
positions; in an attention call made outside the model's forward with fewer queries than keys, each query's position
is the last key its causal mask allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import nn

from ...attention import AttentionCall, AttentionMethod
from ...hf_compat import init_normal_
from ...model_hooks import mute_position_embeddings
from ...placement import layers_of, renamed
from ...probabilities import attention_probabilities
from ...redundancy import checked_dependency_mask, neutral_dependency_mask, redundant_heads_of
from ...registry import HeadUse, MethodSettings, MethodSpec
from ...triton_support import triton_installed, triton_kernel_device
from .equations import key_term, relative_attention, value_term

NAME = "rel_pos"


@dataclass(frozen=True)
class RelPosSettings(MethodSettings):
    """Relative positions' settings (`config.rel_pos`).

    - `encoder_layers`: encoder layers whose self-attention gets the terms: indices (negative count from the end), "all"
    (the default) or None (none). decoder_layers: decoder layers likewise (default None: none; "all" as the paper).
    - `max_relative_position`: k, the clipping distance (>= 1; the paper's base model 16, its big model 8). values:
    whether Eq. 3's value term is added (the paper: True; False keeps only the key term, a score bias, and SDPA's
    fast path). head_selection: "all", or "redundant" (RHE's per-sentence selection, encoder layers only; needs the
    input `dependency_mask`). tables: "head" (a table per layer and per head, the paper's base model) or "layer"
    (shared by a layer's heads, its big model); a saved config.json that has no `tables` and records no default
    for it was written before it existed and reads "layer" (`METHOD.older_files_defaults`). absolute_positions:
    False mutes the absolute position embeddings of the encoder and/or decoder the method is placed on (the paper's
    compared model has none).
    - `implementation`: how the one-Function path (`values`, `head_selection="all"`, no attention dropout) runs;
    it changes no value. "eager": PyTorch operators (`relative_attention`, the weights formed); "triton": the
    flash-style kernels of `hf_headattn.methods.rel_pos.tiled` (no (B, H, T, S) tensor, no weights returned) where
    they apply (`kernel_refusal`), refused where Triton cannot run; "auto" (the default): "eager" everywhere until
    a GPU run has timed the kernels (`runs_kernel`).
    """

    encoder_layers: list[int] | Literal["all"] | None = "all"
    decoder_layers: list[int] | Literal["all"] | None = None
    max_relative_position: int = 16
    values: bool = True
    head_selection: Literal["all", "redundant"] = "all"
    tables: Literal["head", "layer"] = "head"
    absolute_positions: bool = True
    implementation: Literal["auto", "eager", "triton"] = "auto"

    def validate(self, config, name: str) -> None:
        layers(self, config, "encoder", name)
        decoder = layers(self, config, "decoder", name)
        if self.max_relative_position < 1:
            raise ValueError(f"{name}.max_relative_position must be an integer >= 1, got "
                             f"{self.max_relative_position!r}")
        longest = getattr(config, "max_position_embeddings", None)
        if longest is not None and self.max_relative_position > max(longest - 1, 1):
            raise ValueError(f"{name}.max_relative_position={self.max_relative_position} is beyond the model's "
                             f"max_position_embeddings={longest}: no two positions are further apart than "
                             f"{longest - 1}, and each layer would hold 2k+1 rows of never-used tables; expected "
                             f"at most {max(longest - 1, 1)}")
        if self.head_selection == "redundant" and decoder:
            raise ValueError(f"{name}.head_selection='redundant' needs RHE's dependency_mask of the source, which "
                             f"the decoder's self-attention has none of; got {name}.decoder_layers="
                             f"{self.decoder_layers!r}: expected decoder_layers=None (or head_selection='all')")


def layers(settings: RelPosSettings, config, side: str, name: str = NAME) -> list[int]:
    """The layers of `side` ("encoder", "decoder") whose self-attention gets the terms, sorted: `"all"`, the
    indices given, or none (None)."""
    return layers_of(getattr(settings, f"{side}_layers"), getattr(config, f"{side}_layers"), f"{name}.{side}_layers")


def older_spellings(values) -> tuple[dict, list]:
    """`heads` (a head mode, 0.3's development builds) as `head_selection` (`MethodSpec.older_spellings`)."""
    notes = []
    return renamed(values, "heads", "head_selection", notes=notes), notes


def placements(settings: RelPosSettings, config) -> list[tuple[str, int, str]]:
    return [(side, layer, "self") for side in ("encoder", "decoder") for layer in layers(settings, config, side)]


class RelativePositions(AttentionMethod):
    """The tables of one self-attention module: `relative_keys` w^K and, with `values`, `relative_values` w^V,
    each (H, 2k+1, d_head) with `tables="head"` (pruning drops the pruned heads' tables) or (2k+1, d_head) with
    `tables="layer"`, rows w_-k .. w_k, ~ N(0, init_std) (the paper does not give an initialisation)."""

    def __init__(self, settings: RelPosSettings, head_dim: int, num_heads: int):
        super().__init__()
        self.settings = settings
        self.k = settings.max_relative_position
        shape = (2 * self.k + 1, head_dim) if settings.tables == "layer" else (num_heads, 2 * self.k + 1, head_dim)
        self.relative_keys = nn.Parameter(torch.empty(shape))
        self.relative_values = nn.Parameter(torch.empty(shape)) if settings.values else None

    def prune_heads(self, keep: torch.Tensor) -> None:
        if self.settings.tables == "head":
            for name in ("relative_keys", "relative_values"):
                table = getattr(self, name)
                if table is not None:
                    setattr(self, name, nn.Parameter(table.detach().index_select(0, keep.to(table.device)).clone(),
                                                     requires_grad=table.requires_grad))

    def init_weights(self, std: float) -> None:
        init_normal_(self.relative_keys, std=std)
        if self.relative_values is not None:
            init_normal_(self.relative_values, std=std)

    def before(self, call: AttentionCall) -> None:
        """The key term as a score bias on the chosen (sentence-)heads; with `values`, every head taken over."""
        query = call.query
        labels = self.labels(call)  # (T, S) or (B, 1, T, S)
        selected = None
        if self.settings.head_selection == "redundant":
            dependency_mask = checked_dependency_mask(NAME, call.kwargs.get("dependency_mask"), query)
            selected = redundant_heads_of(call, dependency_mask)
        module = call.module
        if self.relative_values is not None and selected is None and not (
                module.training and getattr(module, "dropout", 0.0)):  # both terms in one autograd Function
            offset = None if call.implementation == "eager" else label_offset(call)  # (eager keeps the weights)
            call.take_over(range(query.shape[1]), partial(self.attend_relative, labels=labels, offset=offset))
            return
        bias = key_term(query, self.relative_keys.to(query.dtype), labels, call.scaling)  # (B, H, T, S)
        call.add_score_bias(bias, heads=selected)
        if self.relative_values is not None:
            call.take_over(range(query.shape[1]), partial(self.attend, labels=labels, selected=selected))

    def labels(self, call: AttentionCall) -> torch.Tensor:
        """The relative labels clip(j - i, k) + k, from the call's positions (right under a dynamic or a static
        cache: [`relative_positions`][hf_headattn.attention_call.AttentionCall.relative_positions]): (T, S), or (B, 1,
        T, S) where the query positions are per sentence."""
        labels = call.relative_positions.clamp(-self.k, self.k) + self.k  # (T, S) or (B, T, S)
        return labels if labels.dim() == 2 else labels[:, None]

    def attend(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, *, labels, selected):
        """Eq. 3 on the heads taken over (all of them): alpha from the scores and the mask (the key term in it),
        as eager computes it (softmax in at least float32, dropout on alpha), then alpha @ V plus the value term
        (only on the selected sentence-heads with `head_selection="redundant"`)."""
        probs = _probabilities(query, key, scaling, attention_mask)  # (B, H, T, S)
        probs = nn.functional.dropout(probs, p=dropout, training=module.training)
        extra = value_term(probs, self.relative_values.to(query.dtype), labels)  # (B, H, T, D)
        if selected is not None:
            extra = extra * selected[:, :, None, None].to(extra.dtype)
        output = torch.matmul(probs, value) + extra
        return output.transpose(1, 2), probs


    def attend_relative(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, *, labels,
                        offset=None):
        """Eq. 3-4 on every head without attention dropout: the kernels where `runs_kernel` says so (no weights),
        else `relative_attention` (the key term in the scores' write with the mask, alpha saved, no other (B, H, T,
        S) tensor)."""
        tables = self.relative_keys.to(query.dtype), self.relative_values.to(query.dtype)
        if runs_kernel(self.settings.implementation, query, attention_mask, offset):
            from .tiled import tiled_relative_attention

            output = tiled_relative_attention(query, key, value, *tables, attention_mask, scaling, offset, self.k)
            return output.transpose(1, 2), None
        output, weights = relative_attention(query, key, value, *tables, labels, attention_mask, scaling)
        return output.transpose(1, 2), weights


def label_offset(call: AttentionCall) -> int | None:
    """The int o with label_ij = clip(j - i - o, k) + k for every query of the call (the kernels' labels), or None
    where the queries' positions are not o + 0..T-1 with o known on the host (a static cache's count, positions read
    from the mask): the encoder's 0; the decoder's cached length (0 without a cache)."""
    length, key_length = call.query.shape[2], call.key.shape[2]
    if not call.is_decoder:
        return 0
    past = None if call.context is None else call.context.past_length
    if past is None and length == key_length:
        return 0
    return past if isinstance(past, int) and past + length <= key_length else None


# --- which path runs: the one reader of the `implementation` setting -------------------------------------------------

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes the kernels take (float64 runs `relative_attention`)."""


def kernel_refusal(query: torch.Tensor, mask: torch.Tensor | None, offset: int | None) -> str | None:
    """Why the kernels do not compute this call (None: they do), the call's own reasons first; the rule in one place.

    Today's path (`relative_attention`) runs instead where the call needs what the kernels do not do: a mask that
    requires a gradient (another method's score bias in it), a dtype not in `KERNEL_DTYPES` (or bfloat16 under the
    interpreter), a head dimension over 256, queries whose positions are not `label_offset`'s, or the weights (the
    eager backend, which returns them; attention dropout and `head_selection="redundant"` never reach this path).
    Where the environment cannot run them (no Triton; tensors neither on CUDA nor on the CPU under
    `TRITON_INTERPRET=1`) the reason starts with "environment:"."""
    if offset is None:
        return "the queries' positions are not offset + 0..T-1, or the backend returns the weights (eager)"
    if mask is not None and mask.requires_grad:
        return "the mask requires a gradient (another method's score bias)"
    if query.dtype not in KERNEL_DTYPES or query.shape[-1] > 256:
        return f"{query.dtype} with head dimension {query.shape[-1]}: expected one of {KERNEL_DTYPES}, at most 256"
    if query.dtype == torch.bfloat16 and query.device.type == "cpu":
        return "bfloat16 on the CPU: Triton's interpreter multiplies bfloat16 blocks wrongly (triton 3.9)"
    if not triton_installed():
        return "environment: Triton is not installed (pip install triton)"
    if not triton_kernel_device(query.device):
        return (f"environment: tensors on {query.device.type}; the kernels run on CUDA, or on the CPU under "
                "TRITON_INTERPRET=1")
    return None


def runs_kernel(implementation: str, query: torch.Tensor, mask: torch.Tensor | None, offset: int | None) -> bool:
    """Whether the kernels compute this call: "eager" and "auto" never (until the GPU run, issue #66, times them);
    "triton" where `kernel_refusal` gives no reason, today's path for the call's own reasons, and a `ValueError`
    where the environment cannot run them."""
    if implementation != "triton":
        return False
    reason = kernel_refusal(query, mask, offset)
    if reason is not None and reason.startswith("environment: "):
        raise ValueError(f"{NAME}.implementation='triton' cannot run here: {reason.removeprefix('environment: ')}; "
                         "expected implementation='auto' or 'eager' where the kernels cannot run")
    return reason is None


def _probabilities(query, key, scaling, attention_mask):
    """[`attention_probabilities`][hf_headattn.probabilities.attention_probabilities], with a float mask of every head
    (the key term in it: (B, H, T, S)) as one `baddbmm`: mask + scaling q k^T written once (no separate product, scaling
    and sum, and no scaling in the backward)."""
    batch, heads, length, _ = query.shape
    if attention_mask is None or attention_mask.dtype == torch.bool or attention_mask.shape[:2] != (batch, heads):
        return attention_probabilities(query, key, scaling, attention_mask)
    key_length = key.shape[2]
    scores = torch.baddbmm(attention_mask.to(query.dtype).reshape(batch * heads, length, key_length),
                           query.reshape(batch * heads, length, -1), key.reshape(batch * heads, key_length, -1).mT,
                           alpha=scaling).view(batch, heads, length, key_length)
    return scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)


def build(settings: RelPosSettings, config, module) -> RelativePositions:
    return RelativePositions(settings, module.head_dim, module.num_heads)


def prepare_stack(settings: RelPosSettings, config, side: str, stack) -> None:
    """`absolute_positions=False`: the stack's absolute position embeddings contribute nothing (kept, so that
    checkpoints load as before)."""
    if not settings.absolute_positions:
        mute_position_embeddings(stack, f"{NAME}.absolute_positions=False")


def collect(context, settings: RelPosSettings) -> tuple[dict, None]:
    """No output fields, no objective term."""
    return {}, None


def head_use(settings: RelPosSettings, config, site) -> HeadUse:
    """With the value term every head of the layer is taken over; the key term alone is a score bias."""
    heads = config.encoder_attention_heads if site[0] == "encoder" else config.decoder_attention_heads
    return HeadUse(takes_over=tuple(range(heads)) if settings.values else ())


METHOD = MethodSpec(
    NAME, RelPosSettings, placements, build, collect, head_use=head_use,
    inputs=("dependency_mask",), neutral_inputs=neutral_dependency_mask,
    older_files_defaults={"tables": "layer"},  # saved before the paper's per-head tables became the default
    older_spellings=older_spellings, prepare_stack=prepare_stack,
    kit="hf_headattn.methods.rel_pos.kit",
)
