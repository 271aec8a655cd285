"""DHICM: dynamic head importance computation (Goindani & Shrivastava 2021, §3.1, Eq. 1-5).

A second-level attention scores each head's output per token (Eq. 1-2) and mixes the heads by those importances
(Eq. 3); the objective rewards importances far from uniform: L = L_c - lambda * L_KL (Eq. 4-5). Where: self- and
cross-attention of the chosen layers; the paper's best, and our default in the recipes, is the last encoder and the
last decoder layer (§4.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import AttentionCall, AttentionMethod
from ...head_masks import live_heads, masked_logits
from ...hf_compat import OUTPUT_PROJECTION, init_normal_, init_zeros_, softmax_backward
from ...placement import layer_placements, layers_of, renamed
from ...registry import MethodSettings, MethodSpec
from ...settings_checks import allowed_values, check_range

NAME = "dhicm"
ATTENTIONS = ("self", "cross")
TOP_HEAD_THRESHOLD = 0.9
"""How Eq. 5's KL joins the per-token NLL (the paper does not say; see `kl_objective_term`).
An importance above this counts as a "top head" in `dhicm_stats["top_head_share"]`."""
LANE_VALUES = 2**16
"""Equally likely values of one 16-bit lane of the CPU dropout's random integers (`dropout`)."""


@dataclass(frozen=True)
class DHICMSettings(MethodSettings):
    """DHICM's settings (`config.dhicm`).

    - `encoder_layers` / `decoder_layers` / `cross_layers`: the layers whose encoder self-, decoder self- and decoder
    cross-attention get the mixture ("all", layer numbers, negative counting from the end, or None: none; the
    defaults: none). cross_layers' default "decoder_layers" is the layers decoder_layers names (the paper mixes the
    heads of both attentions of a decoder layer, §3.1).
    - `dim`: d_m of Eq. 2-3 (None: d_model). dropout: dropout after Ux (Eq. 2). kl_weight: lambda of Eq. 4-5.
    - `kl_reduction`: how the KL of Eq. 5 joins the per-token NLL, see `kl_objective_term` ("per_batch", the
        fidelity study's choice, kept by the converged study; "per_token" is release 0.1's reading).
    - `mode`: "paper" (Eq. 3) or "scaled_out_proj" (our fine-tuning variant, keeps the pretrained out_proj).
    """

    encoder_layers: list[int] | Literal["all"] | None = None
    decoder_layers: list[int] | Literal["all"] | None = None
    cross_layers: list[int] | Literal["all", "decoder_layers"] | None = "decoder_layers"
    dim: int | None = None
    dropout: float = 0.2
    kl_weight: float = 0.1
    kl_reduction: Literal["per_token", "per_batch"] = "per_batch"
    mode: Literal["paper", "scaled_out_proj"] = "paper"

    def validate(self, config, name: str) -> None:
        placements(self, config, name)
        if self.dim is not None and self.dim <= 0:
            raise ValueError(f"{name}.dim must be a positive integer (or None for d_model), got {self.dim!r}")
        check_range(self.dropout, f"{name}.dropout", 0.0, 1.0, high_open=True)
        check_range(self.kl_weight, f"{name}.kl_weight", 0.0)

    def switched_on(self) -> bool:
        return any(value not in (None, "decoder_layers")
                   for value in (self.encoder_layers, self.decoder_layers, self.cross_layers))


KL_REDUCTIONS = allowed_values(DHICMSettings, "kl_reduction")
"""The readings of Eq. 5's reduction the settings allow (from their `Literal`)."""


def placements(settings: DHICMSettings, config, name: str = NAME) -> list[tuple[str, int, str]]:
    """The shared vocabulary's placements, with DHICM's layout `cross_layers="decoder_layers"`."""
    decoder = settings.decoder_layers
    return layer_placements(settings, config, name, {"decoder_layers": lambda count: layers_of(
        decoder, count, f"{name}.decoder_layers")})


def older_spellings(values) -> tuple[dict, list]:
    """Release 0.2's `attention` (the kinds of a decoder layer `decoder_layers` places DHICM on, None: both) as
    `decoder_layers` (self-attention) and `cross_layers` (`MethodSpec.older_spellings`)."""
    notes = []
    if "attention" not in values:
        return dict(values), notes
    kinds = values["attention"]
    if kinds is not None and (not isinstance(kinds, (list, tuple)) or not kinds or len(set(kinds)) != len(kinds)
                              or not set(kinds) <= set(ATTENTIONS)):
        raise ValueError(f"attention (an older spelling) must name distinct entries of {ATTENTIONS} (or be None for "
                         f"both), got {kinds!r}")
    values = dict(values)
    decoder = values.pop("decoder_layers", None)
    kinds = set(ATTENTIONS if kinds is None else kinds)
    cross = "decoder_layers" if kinds == set(ATTENTIONS) else decoder if "cross" in kinds else None
    return renamed(values, "attention", "cross_layers", lambda _: {
        "decoder_layers": decoder if "self" in kinds else None, "cross_layers": cross}, notes), notes


# --- pure math -------------------------------------------------------------------------------------------------


def importance_scores(head_outputs: torch.Tensor, ux: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Eq. 2: s(x, O^h) = O^hT W^T U x / sqrt(d_m), for every token and head.

    Parameters
    ----------
    head_outputs
        (B, T, H, d_k) per-head outputs O^h, before the output projection.
    ux
        (B, T, d_m) or (B * T, d_m) U x (after the dropout the paper applies to it).
    w
        (d_m, d_k) W.

    Returns
    -------
    :
        (B, T, H) scores. Computed as O^h . (W^T U x), so no (B, T, H, d_m) tensor is formed, with one batched product
        for all heads (elementwise and a sum: fewer operations than a matmul over (B, T) batches of H x d_k).
    """
    projected = (ux @ w).view(*head_outputs.shape[:2], 1, -1)  # (B, T, 1, d_k) = (W^T U x)^T
    return (head_outputs * projected).sum(-1) / math.sqrt(w.shape[0])


def importance_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 1: the head importances G(x, O^h), the softmax of the scores over the heads (last dimension)."""
    return torch.softmax(scores, dim=-1)


def combine_heads(head_outputs: torch.Tensor, importance: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eq. 3 without W_s: sum_h G(x, O^h) V O^h, as V (sum_h G_h O^h) since V is shared by the heads.

    head_outputs (B, T, H, d_k), importance (B, T, H), v (d_m, d_k) -> (B, T, d_m).
    """
    mixed = (head_outputs * importance.unsqueeze(-1)).sum(2)  # (B, T, d_k)
    return mixed @ v.T


def attend_over_heads(head_outputs: torch.Tensor, projected: torch.Tensor, v: torch.Tensor,
                      head_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Eq. 1-3 without W_s as one attention call, for when G itself is not needed (no loss, no read-out).

    Eq. 1-3 are an attention over the heads: the query is W^T U x, the keys and values are the head outputs O^h and
    the scale is 1 / sqrt(d_m), so `scaled_dot_product_attention` gives sum_h G_h O^h in one fused operation; V is
    applied after. Equal to
    `combine_heads(head_outputs, importance_softmax(importance_scores(head_outputs, ux, w)), v)` with
    `projected = ux @ w`.

    head_outputs (B, T, H, d_k), projected (B, T, d_k) or (B * T, d_k), v (d_m, d_k) -> (B, T, d_m); `head_mask`
    (1 or B, H) leaves masked heads out of the softmax as
    [`hf_headattn.head_masks.masked_logits`][hf_headattn.head_masks.masked_logits] does.
    """
    batch, length, heads, head_dim = head_outputs.shape
    tokens = batch * length
    keys = head_outputs.view(tokens, 1, heads, head_dim)  # (N, 1, H, d_k): one "sequence" of H heads per token
    query = projected.reshape(tokens, 1, 1, head_dim)  # (N, 1, 1, d_k)
    bias = None
    if head_mask is not None:  # (N, 1, 1, H) additive: log m, the most negative float where m = 0
        bias = masked_logits(head_outputs.new_zeros(head_mask.shape[0], 1, heads), head_mask)
        bias = bias.expand(batch, length, heads).reshape(tokens, 1, 1, heads)
    mixed = F.scaled_dot_product_attention(query, keys, keys, attn_mask=bias, scale=v.shape[0] ** -0.5)
    return (mixed.view(tokens, head_dim) @ v.T).view(batch, length, -1)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, as `F.dropout`, with a cheaper random draw on the CPU.

    There the mask compares 16-bit lanes of 64-bit random integers (four lanes per draw of the generator) with a
    threshold: 58 us for 512 x 128 on 2 cores, against 187 us for `rand` and 489 us for the `bernoulli_` that
    `F.dropout` draws. p is rounded to a multiple of 2^-16 (by less than 8e-6) and the kept values are scaled by
    the exact inverse of the rounded keep probability, so E[output] = x exactly. Another random stream than
    `F.dropout`, which it uses elsewhere and under `torch.compile`."""
    dropped = round(p * LANE_VALUES)  # of the LANE_VALUES equally likely values of a lane
    if not training or x.device.type != "cpu" or not 0 < dropped < LANE_VALUES or torch.compiler.is_compiling():
        return F.dropout(x, p, training)  # (torch.compile makes its own random numbers)
    if x.shape[-1] % 4 == 0:  # the lanes in x's shape at once
        lanes = torch.empty(*x.shape[:-1], x.shape[-1] // 4, dtype=torch.int64).random_(-(2**63), None)
        lanes = lanes.view(torch.int16)
    else:
        lanes = torch.empty(-(-x.numel() // 4), dtype=torch.int64).random_(-(2**63), None).view(torch.int16)
        lanes = lanes[: x.numel()].view(x.shape)
    keep = lanes >= dropped - LANE_VALUES // 2  # lanes: -32768 ... 32767
    return x * keep.to(x.dtype).mul_(LANE_VALUES / (LANE_VALUES - dropped))


def token_weights(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) weights of a mean over the real tokens (`mask` True): 1 / their number there, 0 elsewhere (None for
    None: every token counts)."""
    return None if mask is None else mask / mask.sum().clamp(min=1)


def query_weights(call) -> torch.Tensor | None:
    """`token_weights` of `call.query_mask`, made once per forward for each side (encoder, decoder) and
    shared by the modules there (three operators a module fewer)."""
    mask = call.query_mask
    if mask is None:
        return None
    key = (NAME, "token_weights", call.is_decoder)
    if key not in call.context.cache:
        call.context.cache[key] = token_weights(mask)
    return call.context.cache[key]


def token_mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """The mean of (B, T) `values` (float or bool) over the real tokens, with `weights` from
    `token_weights`."""
    if weights is not None:
        return (values * weights).sum()
    return values.mean() if values.is_floating_point() else values.float().mean()


def importance_statistics(importance: torch.Tensor, log_importance: torch.Tensor, weights: torch.Tensor | None,
                          heads: int | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 4-5 for one module and its collapse statistics, from G and log G (B, T, H): the mean over real tokens
    (`weights` from `token_weights`, None: all) of KL(G || uniform) (Eq. 4), the mean normalised entropy
    H(G) / ln H (no gradient) and the share of real tokens whose top head carries more than `TOP_HEAD_THRESHOLD`
    (no gradient).

    `heads`: the number of heads the uniform distribution spreads over, an int or (1 or B, 1, 1) per sentence (the
    heads a head mask leaves, [`hf_headattn.head_masks.live_heads`][hf_headattn.head_masks.live_heads]; None: H). KL =
    sum_h G_h (log G_h + ln H), from log-softmax (precise for nearly uniform G); H(G) / ln H = 1 - KL / ln H (0 for a
    single head). A sentence whose mask leaves no head has KL 0 and entropy 0 there (the module mixes nothing), with
    finite gradients.
    """
    heads = importance.shape[-1] if heads is None else heads
    if isinstance(heads, int):
        log_heads = math.log(heads)
        kl = (importance * (log_importance + log_heads)).sum(-1)  # (B, T)
    else:  # ln max(H, 1): no -inf where no head is left, whose KL is then set to 0
        log_heads = heads.clamp_min(1).to(importance.dtype).log()
        kl = (importance * (log_importance + log_heads)).sum(-1).where(heads[..., 0] > 0, 0.0)  # (B, T)
    mean_kl = token_mean(kl, weights)
    if isinstance(log_heads, float):
        return mean_kl, *entropy_and_top_share(importance, mean_kl, weights, log_heads)
    with torch.no_grad():  # per sentence: the mean of 1 - KL / ln H over tokens, 0 where one head or none is left
        share = token_mean(importance.amax(-1) > TOP_HEAD_THRESHOLD, weights)
        log_heads = log_heads[..., 0]  # (1 or B, 1)
        entropy = token_mean(torch.where(log_heads > 0, 1 - kl / log_heads.clamp_min(1e-12), 0.0), weights)
    return mean_kl, entropy, share


@torch.no_grad()
def entropy_and_top_share(importance: torch.Tensor, mean_kl: torch.Tensor, weights: torch.Tensor | None,
                          log_heads: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`importance_statistics`' mean normalised entropy and top-head share for one number of heads (`log_heads`
    = ln H): the mean of 1 - KL / ln H is 1 - mean KL / ln H, one operator (`rsub`: 1 - alpha mean KL)."""
    share = token_mean(importance.amax(-1) > TOP_HEAD_THRESHOLD, weights)
    entropy = torch.rsub(mean_kl, 1, alpha=1 / log_heads) if log_heads > 0 else torch.zeros_like(mean_kl)
    return entropy, share


def kl_objective_term(kl: torch.Tensor, kl_weight: float, reduction: str, target_tokens) -> torch.Tensor:
    """The objective term of Eq. 5, -lambda * L_KL, added to the model's mean per-token NLL.

    `kl` is KL-bar, the mean over the DHICM modules of each module's mean over real tokens of KL(G || uniform)
    (Eq. 4). The paper writes L = L_c - lambda L_KL without saying how either side is reduced:

    * `"per_token"`: `-lambda * KL-bar`. Both sides are per-token means, so lambda weighs one token's KL against
      one token's NLL (lambda 0.1 collapses every module to one head within ~50 steps on Multi30k).
    * `"per_batch"`: `-lambda * KL-bar / N` with N the batch's real target tokens. This is the objective
      `(sum_t NLL_t - lambda * KL-bar) / N`: fairseq's token-summed loss, divided by its `sample_size` = N, with
      one batch-level KL, i.e. an effective lambda of lambda / N per token (about 1e-4 for lambda 0.1 and batches
      of ~1000 target tokens). With gradient accumulation each micro-batch's term is weighted by its share of the
      tokens ([`hf_headattn.losses.total_objective`][hf_headattn.losses.total_objective]), so the accumulated term is
      -lambda * sum(KL-bar) / N_all.
    """
    if reduction == "per_token":
        return -kl_weight * kl
    if reduction == "per_batch":
        return -kl_weight * kl / target_tokens
    raise ValueError(f"{NAME}.kl_reduction must be one of {KL_REDUCTIONS}, got {reduction!r}")


def projected_input(hidden: torch.Tensor, u: torch.Tensor, p: float) -> torch.Tensor:
    """U x of Eq. 2 with the dropout `p` the paper applies to it (0: none): (B, T, d) -> (B * T, d_m)."""
    return dropout(hidden.reshape(-1, hidden.shape[-1]) @ u.T, p, p > 0)


class HeadMixture(torch.autograd.Function):
    """Eq. 1-4 of paper mode for all tokens at once, forward and backward written out (#47: DHICM's GPU step was
    host work). The composition of `importance_scores`, log-softmax (Eq. 1), `combine_heads` and Eq. 4's
    KL, gradchecked against it in float64, with one autograd node instead of one per operation and fewer operators:
    a module's forward and backward 71 against 93 (`tests/test_overhead.py`). Products over heads are elementwise
    with a sum, as in `importance_scores` (a `bmm` over B T batches of H x d_k is slower on CPUs).

    `apply(heads (N, H, d_k), ux (N, d_m), w, v, weights (N,) or None, log_heads)` -> (sum_h G_h V O^h (N, d_m),
    mean KL (Eq. 4) with the token `weights` (None: the plain mean), G (N, H), no gradient). Backward: with
    g = dL/dG from Eq. 3 plus w_t (log G + ln H + 1) from Eq. 4 (whose constants the softmax's backward cancels),
    dL/ds = G (g - &lt;G, g>), and s = O^h . p / sqrt(d_m) with p = W^T U x gives dL/dp and the second term of dL/dO.
    Runs the backward under the forward's autocast state, as `torch.amp.custom_bwd` does.
    """

    @staticmethod
    def forward(ctx, heads, ux, w, v, weights, log_heads):
        tokens, count, head_dim = heads.shape
        device = heads.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        if ctx.autocast[1]:  # autocast's casts of W and V, kept for the backward (not cast again there)
            w, v = w.to(ctx.autocast[2]), v.to(ctx.autocast[2])
        projected = torch.mm(ux, w).unsqueeze(1)  # (N, 1, d_k): W^T U x
        scores = (heads * projected).sum(-1) / math.sqrt(w.shape[0])  # Eq. 2, as importance_scores
        if scores.dtype in (torch.float16, torch.bfloat16):  # G and the KL in float32 at least
            scores = scores.float()
        log_importance = torch.log_softmax(scores, dim=-1)  # Eq. 1
        importance = log_importance.exp()
        kl = (importance * (log_importance + log_heads)).sum(-1)  # Eq. 4, per token
        mean_kl = kl.mean() if weights is None else torch.dot(kl, weights.to(kl.dtype))
        mixing = importance.to(heads.dtype).unsqueeze(2)  # (N, H, 1): G in the heads' dtype (autocast's)
        mixed = (heads * mixing).sum(1)  # sum_h G_h O^h
        # (projected and G kept as the products broadcast them: no unsqueeze again in the backward)
        ctx.save_for_backward(heads, ux, w, v, projected, importance, log_importance, mixing, mixed, weights)
        ctx.mark_non_differentiable(importance)
        ctx.set_materialize_grads(False)
        return torch.mm(mixed, v.t()), mean_kl, importance  # Eq. 3 without W_s

    @staticmethod
    def backward(ctx, grad_output, grad_kl, _):
        heads, ux, w, v, projected, importance, log_importance, mixing, mixed, weights = ctx.saved_tensors
        tokens, count, head_dim = heads.shape
        device, enabled, dtype = ctx.autocast
        with torch.autocast(device, dtype=dtype, enabled=enabled):
            if grad_output is None:
                grad_output = mixed.new_zeros(tokens, v.shape[0])
            grad_mixed = torch.mm(grad_output, v).unsqueeze(1)  # (N, 1, d_k)
            grad_importance = (heads * grad_mixed).sum(-1).to(importance.dtype)
            if grad_kl is not None:
                token_grad = grad_kl / tokens if weights is None else (grad_kl * weights).unsqueeze(-1)
                grad_importance = torch.addcmul(grad_importance, token_grad, log_importance)
            # G (g - <G, g>): softmax's backward, one operator for four (issue 63)
            grad_scores = softmax_backward(grad_importance, importance)
            grad_scores = (grad_scores / math.sqrt(w.shape[0])).to(heads.dtype).unsqueeze(2)  # (N, H, 1)
            grad_projected = (heads * grad_scores).sum(1)
            # G_h dL/d(mixed) + dL/ds_h p, both outer products
            grad_heads = (mixing * grad_mixed).addcmul_(grad_scores, projected)
            return (grad_heads, torch.mm(grad_projected, w.t()), torch.mm(ux.t(), grad_projected),
                    torch.mm(grad_output.t(), mixed), None, None)


def mix_heads_paper(hidden: torch.Tensor, head_outputs: torch.Tensor, u: torch.Tensor, w: torch.Tensor,
                    v: torch.Tensor, weights: torch.Tensor | None, p: float) -> tuple:
    """`mix_heads` in paper mode without a head mask, with losses: U x with dropout, then `HeadMixture`.
    hidden (B, T, d), head_outputs (B, T, H, d_k), weights (B, T) or None -> ((B, T, d_m), G (B, T, H), statistics)."""
    batch, length, heads, head_dim = head_outputs.shape
    output, mean_kl, importance = HeadMixture.apply(
        head_outputs.reshape(-1, heads, head_dim), projected_input(hidden, u, p), w, v,
        None if weights is None else weights.view(-1), math.log(heads))
    importance = importance.view(batch, length, heads)
    return output.view(batch, length, -1), importance, (mean_kl, *entropy_and_top_share(
        importance, mean_kl, weights, math.log(heads)))


def mix_heads(hidden: torch.Tensor, head_outputs: torch.Tensor, u: torch.Tensor, w: torch.Tensor,
              v: torch.Tensor | None, head_mask: torch.Tensor | None, weights: torch.Tensor | None, p: float,
              losses: bool) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
    """Eq. 1-3 of one module: U x with dropout `p` (Eq. 2), the importances G (Eq. 1, with the head mask's
    `log m`), and the heads mixed by them: with `v` (paper mode) sum_h G_h V O^h (Eq. 3 without W_s, (B, T, d_m)),
    else (`scaled_out_proj`) each head's output scaled by H G_h ((B, T, H, d_k)); with `losses` also
    `importance_statistics` with the token `weights` (`token_weights`; None: every token counts),
    else None. (Compiled on its own, as EaDRA's pass is compiled, it did not make an H100 step faster: 1.144 against
    1.129 eager at transformer-base, `benchmarks/results/gpu`.)

    hidden (B, T, d), head_outputs (B, T, H, d_k) -> (output, G (B, T, H), statistics). Paper mode without a head
    mask, with losses (training), is `mix_heads_paper`, the same equations in fewer operators."""
    if losses and v is not None and head_mask is None:
        return mix_heads_paper(hidden, head_outputs, u, w, v, weights, p)
    ux = projected_input(hidden, u, p)
    scores = masked_logits(importance_scores(head_outputs, ux, w), head_mask)  # (B, T, H)
    heads = live_heads(head_mask, scores.shape[-1])
    heads = heads if isinstance(heads, int) else heads[:, None, None]  # (1 or B, 1, 1)
    statistics = None
    if losses:
        if scores.dtype in (torch.float16, torch.bfloat16):  # G and the KL in float32 at least
            scores = scores.float()
        log_importance = torch.log_softmax(scores, dim=-1)
        importance = log_importance.exp()
        statistics = importance_statistics(importance, log_importance, weights, heads)
    else:
        importance = importance_softmax(scores)
    if v is not None:
        return combine_heads(head_outputs, importance.to(head_outputs.dtype), v), importance, statistics
    return head_outputs * (heads * importance).unsqueeze(-1).to(head_outputs.dtype), importance, statistics


# --- the module attached to an attention module ---------------------------------------------------------------


class DHICM(AttentionMethod):
    """The second-level attention over the heads of one attention module (§3.1).

    `mode="paper"`: the module outputs W_s sum_h G V O^h (Eq. 3). W_s is the attention module's `out_proj`
    (d_m x d -> d; with d_m = d_model a pretrained `out_proj` initialises it, otherwise it is replaced by a new
    `Linear(d_m, d)`), so every parameter is used; its bias is kept, a harmless addition to Eq. 3.
    `mode="scaled_out_proj"` (our fine-tuning variant, not in the paper): the pretrained `out_proj` is kept and
    head h's block is weighted by H * G_h; U starts at zero, so G starts uniform and the model starts exactly as the
    pretrained one.
    The parameters W (d_m x d_k), U (d_m x d), V (d_m x d_k) have no bias, as in Eq. 2-3.
    """

    records_loss_terms = True

    @property
    def out_proj_per_head(self) -> bool:
        """In paper mode `out_proj` is W_s, which reads the d_m-dimensional mixture, not the heads."""
        return self.mode != "paper"

    def __init__(self, d_model: int, num_heads: int, d_m: int, dropout: float, mode: str):
        super().__init__()
        head_dim = d_model // num_heads
        self.mode = mode
        self.w = nn.Parameter(torch.empty(d_m, head_dim))
        self.u = nn.Parameter(torch.empty(d_m, d_model))
        self.v = nn.Parameter(torch.empty(d_m, head_dim)) if mode == "paper" else None
        self.dropout = nn.Dropout(dropout)

    def init_weights(self, std: float) -> None:
        init_normal_(self.w, std=std)
        if self.mode == "paper":
            init_normal_(self.u, std=std)
            init_normal_(self.v, std=std)
        else:
            init_zeros_(self.u)

    def after(self, call: AttentionCall, attn_output: torch.Tensor) -> torch.Tensor:
        """Eq. 1-3 on the per-head output (`mix_heads`). Head masks
        (`call.head_mask`, already applied to the per-head output) follow
        [`hf_headattn.head_masks`][hf_headattn.head_masks]' rule: head h's weight in the softmax over heads (Eq. 1) is
        m_h exp(s_h) (`log m` is added to its score), and it counts in H (Eq. 4's uniform reference, `scaled_out_proj`'s
        factor) when m_h > 0; so a head masked with 0 counts nowhere, as if pruned. A mask that leaves no head outputs 0
        (`out_proj`'s bias in paper mode) with KL 0."""
        context, head_mask = call.context, call.head_mask
        losses = context is not None and context.compute_losses  # KL (Eq. 4-5) only when a loss is needed
        readout = context is not None and "output_head_importance" in context.flags
        if self.mode == "paper" and not losses and not readout:  # e.g. generate: G is not needed, one fused call
            ux = projected_input(call.hidden_states, self.u, self.dropout.p if self.training else 0.0)
            return attend_over_heads(attn_output, ux @ self.w, self.v, head_mask)  # (B, T, d_m), to out_proj = W_s
        output, importance, statistics = mix_heads(
            call.hidden_states, attn_output, self.u, self.w, self.v, head_mask, query_weights(call) if losses else None,
            self.dropout.p if self.training else 0.0, losses)
        if losses:
            context.record(NAME, statistics)
        if readout:
            self._read_out(call, importance)
        return output

    @staticmethod
    def _read_out(call: AttentionCall, importance: torch.Tensor) -> None:
        mask = call.query_mask
        readout = importance.detach() if mask is None else importance.detach() * mask.unsqueeze(-1)
        call.context.record("head_importances", (call.module.headattn_name, readout))


def build(settings: DHICMSettings, config, module) -> DHICM:
    d_m = settings.dim or config.d_model
    method = DHICM(config.d_model, module.num_heads, d_m, settings.dropout, settings.mode)
    if settings.mode == "paper" and d_m != config.d_model:
        bias = getattr(module, OUTPUT_PROJECTION).bias is not None
        setattr(module, OUTPUT_PROJECTION, nn.Linear(d_m, config.d_model, bias=bias))  # W_s
    return method


def module_mean(values: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The mean of the modules' 0-d KLs (Eq. 5's KL-bar) as a sum and one division: M operators forward and one
    backward (the division's), against `torch.stack(values).mean()`'s 2 and M + 2 (the mean's expand and division,
    a select per module), a step's host work (#47). The same value as that mean for up to 4 modules (the same order
    of additions; beyond, the last bit may differ), the same gradients."""
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total / len(values)


def collect(context, settings: DHICMSettings) -> tuple[dict, torch.Tensor | None]:
    """Mean KL over tokens and DHICM modules (Eq. 5), the objective term (`kl_objective_term` with
    `settings.kl_reduction`), and `dhicm_stats` (the modules' collapse statistics averaged over the modules,
    from `importance_statistics`).

    For `"per_batch"` N is the batch's real target tokens (the context's target mask; the model always has one
    when it computes a loss, and without one the term is not used, so N = 1 there).
    """
    records = context.recorded(NAME)
    if not records:
        return {}, None
    kls, entropies, shares = zip(*records)
    kl = module_mean(kls)
    entropy, top_share = (torch.stack(values).mean() for values in (entropies, shares))  # no gradient
    fields = {"dhicm_kl": kl, "dhicm_stats": {"importance_entropy": entropy, "top_head_share": top_share}}
    if "output_head_importance" in context.flags:
        fields["head_importances"] = dict(context.recorded("head_importances"))
    tokens = context.target_tokens()
    tokens = 1 if tokens is None else tokens.clamp(min=1)
    return fields, kl_objective_term(kl, settings.kl_weight, settings.kl_reduction, tokens)


METHOD = MethodSpec(
    NAME, DHICMSettings, placements, build, collect,
    flags=("output_head_importance",),
    outputs={
        "dhicm_kl": "mean KL of the head-importance distributions from uniform (Eq. 5), unweighted",
        "dhicm_stats": "{'importance_entropy': mean H(G) / ln H, 'top_head_share': share of tokens whose top head "
                       "carries > 0.9}: how close the importances are to one-hot",
        "head_importances": "{module name: (batch, tokens, heads) importance G}, with output_head_importance=True",
    },
    logged=("dhicm_kl", "dhicm_stats"),
    legacy_fields={f"dhicm_{key}": key for key in (
        "encoder_layers", "decoder_layers", "attention", "dim", "dropout", "kl_weight", "kl_reduction", "mode")},
    legacy_defaults={"kl_reduction": "per_token"},
    older_spellings=older_spellings,
    kit="hf_headattn.methods.dhicm.kit",
)
