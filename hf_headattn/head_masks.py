"""Head masks: scale each attention head's output before `out_proj` (transformers 4's `head_mask`, removed in 5).

One mask per component (`hf_headattn.sites`), each (layers, heads) in the model's *original* head numbering (a
pruned head keeps its number, see [`hf_headattn.pruning`][hf_headattn.pruning]):

* `"encoder"`: encoder self-attention, forward argument `head_mask`;
* `"decoder"`: decoder self-attention, `decoder_head_mask`;
* `"cross"`: cross-attention, `cross_attn_head_mask`.

A forward argument may also be (batch, layers, heads), one mask per sentence (what `generate` expands for beams);
its batch must be the batch that reaches those attention modules (the source's for `head_mask`, the target's for
the others). A mask kept on the model ([`set_head_mask`][hf_headattn.head_masks.set_head_mask]) applies to every forward
and to `generate`; with a forward argument too, their product applies. Every value must be finite and in [0, 1] (checked
once per forward, not under `torch.compile`: [`check_head_mask`][hf_headattn.head_masks.check_head_mask]).

What a value m_h means, one rule for every method: m_h is the share of head h that is kept.

* Head h outputs `m_h * O_h` (Michel et al.'s xi_h; every method's `after` gets the scaled outputs).
* Where a method sums, averages or normalises over heads, head h's term there is weighted by m_h: EaDRA's
  regularizers of head h are multiplied by m_h (Eq. 9), DHICM's softmax over the heads weighs head h by
  m_h exp(s_h) (Eq. 1, [`masked_logits`][hf_headattn.head_masks.masked_logits]).
* Where a method counts heads (DHICM's uniform reference in Eq. 4 and its `scaled_out_proj` factor H), a head
  counts when m_h > 0 ([`live_heads`][hf_headattn.head_masks.live_heads]).

So 1 keeps a head unchanged, 0 removes it everywhere exactly as pruning it does (outputs, loss terms, gradients),
and values between weaken it continuously. The mask is differentiable: with `requires_grad` its gradient is the
head importance of Michel et al. (2019). With the eager backend, returned attention weights are scaled alike
(transformers 4 did so); flex attention's log-sum-exp, which it returns instead of weights on CUDA, is left as it is
([`scale_weights`][hf_headattn.head_masks.scale_weights]).
"""

from __future__ import annotations

import torch
from torch import nn

from .hf_compat import INPUT_PROJECTIONS
from .sites import COMPONENTS, component_of, component_shape

ARGUMENTS_BY_COMPONENT = {"encoder": "head_mask", "decoder": "decoder_head_mask", "cross": "cross_attn_head_mask"}
"""Each component's forward argument."""
ARGUMENTS = tuple(ARGUMENTS_BY_COMPONENT.values())
"""The forward arguments, in [`ARGUMENTS_BY_COMPONENT`][hf_headattn.head_masks.ARGUMENTS_BY_COMPONENT] order."""


def check_head_mask(mask, config, component: str, name: str, per_sentence: bool = True, batch: int | None = None,
                    values: bool = True) -> torch.Tensor:
    """`mask` if it is a valid `component` mask, else a `ValueError` naming `name`, what it got and what was
    expected: a floating tensor of shape (layers, heads), or (batch, layers, heads) with `per_sentence` (its batch
    `batch`, that of the input it meets, when given), with `values` also finite values in [0, 1]
    ([`check_values`][hf_headattn.head_masks.check_values])."""
    layers, heads = component_shape(config, component)
    shapes = f"(layers, heads) = {(layers, heads)}" + (" or (batch, layers, heads)" if per_sentence else "")
    if not isinstance(mask, torch.Tensor) or not mask.is_floating_point():
        got = type(mask).__name__ if not isinstance(mask, torch.Tensor) else f"a {mask.dtype} tensor"
        raise ValueError(f"{name} must be a floating tensor of shape {shapes} (1 keeps a head, 0 removes it), "
                         f"got {got}")
    if tuple(mask.shape[-2:]) != (layers, heads) or mask.dim() not in ((2, 3) if per_sentence else (2,)):
        hint = (" (generate repeats a (layers, heads) mask for beams: pass one mask per sentence, or keep it on the "
                "model with set_head_mask)") if mask.dim() == 2 and mask.shape[1] == heads else ""
        raise ValueError(f"{name} has shape {tuple(mask.shape)}, expected {shapes}{hint}")
    if mask.dim() == 3 and batch is not None and mask.shape[0] != batch:
        raise ValueError(f"{name} has one mask per sentence for a batch of {mask.shape[0]} (shape "
                         f"{tuple(mask.shape)}), but its attention gets a batch of {batch}; expected "
                         f"({batch}, {layers}, {heads}), or a (layers, heads) mask for every sentence")
    if values:
        check_values({name: mask})
    return mask


def check_values(masks: dict[str, torch.Tensor]) -> None:
    """A `ValueError` naming the first of `masks` ({name: mask}) with a value that is not finite or not in
    [0, 1], and those values. One fused check with one host sync for all of them; none under `torch.compile` (a
    data-dependent branch would break the graph) and no autograd use (a mask may require gradients)."""
    if not masks or torch.compiler.is_compiling():
        return
    valid = {name: (mask.detach() >= 0) & (mask.detach() <= 1) for name, mask in masks.items()}  # False at NaN
    device = next(iter(valid.values())).device
    if bool(torch.stack([ok.all().to(device) for ok in valid.values()]).all()):
        return
    for name, ok in valid.items():
        bad = masks[name].detach()[~ok]
        if bad.numel():
            shown = ", ".join(str(value) for value in bad[:5].tolist()) + (", ..." if bad.numel() > 5 else "")
            raise ValueError(f"{name} must hold finite values in [0, 1] (1 keeps a head, 0 removes it as pruning "
                             f"does, values between weaken it); got {bad.numel()} value(s) outside it: {shown}")


def input_batches(values: dict) -> dict[str, int | None]:
    """{component: the batch that reaches its attention modules} in a forward with the arguments `values`: the
    source's (`input_ids`, `inputs_embeds` or `encoder_outputs`) for `"encoder"`, the target's
    (`decoder_input_ids`, `decoder_inputs_embeds`; else the source's, which mBART shifts into the target) for
    `"decoder"` and `"cross"`; None where the arguments do not say."""
    def batch_of(*names):
        for name in names:
            value = values.get(name)
            if value is not None:
                return (value if torch.is_tensor(value) else value[0]).shape[0]  # encoder_outputs: (hidden, ...)
        return None

    source = batch_of("input_ids", "inputs_embeds", "encoder_outputs")
    target = batch_of("decoder_input_ids", "decoder_inputs_embeds")
    target = source if target is None else target
    return {"encoder": source, "decoder": target, "cross": target}


def check_forward_masks(values: dict, config) -> None:
    """The head-mask forward arguments among `values` (a forward's arguments) checked by
    [`check_head_mask`][hf_headattn.head_masks.check_head_mask], each against the batch it meets
    ([`input_batches`][hf_headattn.head_masks.input_batches]), their values in one fused check."""
    batches = input_batches(values)
    masks = {argument: check_head_mask(values[argument], config, component, argument, batch=batches[component],
                                       values=False)
             for component, argument in ARGUMENTS_BY_COMPONENT.items() if values.get(argument) is not None}
    check_values(masks)


def module_rows(mask: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The rows of a (layers, heads) or (batch, layers, heads) mask for one attention module: (1 or batch, its
    heads), in its current numbering (its pruned heads left out)."""
    rows = mask[..., module.headattn_layer, :]
    rows = rows if rows.dim() == 2 else rows.unsqueeze(0)
    kept = module.headattn_heads
    return rows if kept is None else rows.index_select(-1, kept.on(rows.device))


def module_head_mask(module: nn.Module, kwargs: dict) -> torch.Tensor | None:
    """The head mask of one attention call, (1 or batch, heads): the module's kept mask times the forward
    argument's rows; `None` when neither is set. The forward arguments are removed from `kwargs`."""
    given = {component: kwargs.pop(argument, None)
             for component, argument in ARGUMENTS_BY_COMPONENT.items()}[component_of(module)]
    kept = module.headattn_head_mask
    if given is None:
        return kept
    rows = module_rows(given, module)
    return rows if kept is None else rows * kept


def scale_heads(attn_output: torch.Tensor, head_mask: torch.Tensor) -> torch.Tensor:
    """Each head's output times its mask: attn_output (B, T, H, D), head_mask (1 or B, H)."""
    return attn_output * head_mask[:, None, :, None].to(attn_output.dtype)


def scale_weights(attn_weights: torch.Tensor | None, head_mask: torch.Tensor) -> torch.Tensor | None:
    """The backend's second output with the head mask (1 or B, H) applied where it is attention weights.

    Attention weights (B, H, T, S), as the eager backend returns them, are multiplied by the mask. Anything else
    passes unchanged: `None` (SDPA, flex attention on the CPU) and flex attention's log-sum-exp (B, H, T) of each
    query's scores, which transformers' `flex_attention_forward` returns instead of weights off the CPU (on CUDA).
    The mask scales a head's output after its softmax, so the scores and their log-sum-exp are what they were
    without it (a masked head's lse is the unmasked one's, as its probabilities are); multiplying a log by m_h would
    be meaningless, and the (1 or B, H, 1, 1) mask does not broadcast over (B, H, T)."""
    if attn_weights is None or attn_weights.dim() != 4:
        return attn_weights
    return attn_weights * head_mask[:, :, None, None].to(attn_weights.dtype)


def live_heads(head_mask: torch.Tensor | None, heads: int) -> torch.Tensor | int:
    """The number of heads a mask leaves (entries > 0), (1 or B,), or `heads` without a mask: what a method that
    mixes heads counts instead of H, so that a masked head counts as a pruned one."""
    return heads if head_mask is None else (head_mask > 0).sum(-1)


def masked_logits(logits: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits over heads (..., H) for a softmax over the heads with masked heads left out: `logit + log m`, the
    most negative float where `m = 0` (a masked head gets weight exactly 0, the others are renormalised, as
    after pruning it). `head_mask` (1 or B, H) broadcasts over the middle dimensions of (B, ..., H) logits.
    Gradients to the mask are finite everywhere (0 at `m = 0`)."""
    if head_mask is None:
        return logits
    m = head_mask.to(logits.dtype).view(head_mask.shape[0], *([1] * (logits.dim() - 2)), head_mask.shape[-1])
    tiny = torch.finfo(logits.dtype).tiny
    return torch.where(m > 0, logits + m.clamp_min(tiny).log(), torch.finfo(logits.dtype).min)


def set_head_mask(model: nn.Module, component: str, mask: torch.Tensor | None) -> None:
    """Keep a (layers, heads) mask of `component` on `model`'s attention modules (`None`: remove it); it applies
    to every forward and `generate` until removed, and moves with the model (a non-persistent buffer: not saved)."""
    if component not in COMPONENTS:
        raise ValueError(f"head mask component must be one of {list(COMPONENTS)}, got {component!r}")
    if mask is not None:
        check_head_mask(mask, model.config, component, f"set_head_mask({component!r}, ...)", per_sentence=False)
    for module in attention_modules(model, component):
        device = getattr(module, INPUT_PROJECTIONS[0]).weight.device
        row = None if mask is None else module_rows(mask.detach(), module).to(device)
        module.register_buffer("headattn_head_mask", row, persistent=False)


def get_head_mask(model: nn.Module, component: str) -> torch.Tensor | None:
    """The (layers, heads) mask of `component` kept on `model` (0 at pruned heads), or `None`."""
    modules = attention_modules(model, component)
    if all(module.headattn_head_mask is None for module in modules):
        return None
    mask = torch.zeros(component_shape(model.config, component))
    for module in modules:
        row = torch.ones(module.num_heads) if module.headattn_head_mask is None else module.headattn_head_mask[0].cpu()
        mask[module.headattn_layer, head_numbers(module)] = row.float()
    return mask


def routed_modules(model: nn.Module) -> dict[str, nn.Module]:
    """`{module name: attention module}` of an hf-headattn model (or stack): the modules
    `hf_headattn.attention.route` tagged."""
    return {module.headattn_name: module for module in model.modules() if hasattr(module, "headattn_layer")}


def attention_modules(model: nn.Module, component: str) -> list[nn.Module]:
    """The attention modules of `component` in `model` (routed ones: hf-headattn models), in layer order."""
    found = [module for module in routed_modules(model).values() if component_of(module) == component]
    return sorted(found, key=lambda module: module.headattn_layer)


def head_numbers(module: nn.Module) -> list[int]:
    """The original numbers of the heads an attention module has (all of them until it is pruned)."""
    return list(range(module.num_heads)) if module.headattn_heads is None else list(module.headattn_heads.numbers)
