"""The translation loss: label-smoothed cross-entropy, and how the methods' terms join it."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F

from .hf_compat import linear_cross_entropy

IGNORE_INDEX = -100


def label_smoothed_nll_loss(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float = 0.0, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, summed over the target tokens that are not `ignore_index`.

    loss_t = (1 - epsilon) * (-log p(y_t)) + epsilon * mean_v(-log p(v)), the form of Szegedy et al. (2016) that
    fairseq, `torch.nn.CrossEntropyLoss(label_smoothing=...)` and HF's `LabelSmoother` use.

    Parameters
    ----------
    logits : (B, T, V) tensor; half precision is computed in float32, chunk by chunk
        ([`chunked_smoothed_nll`][hf_headattn.losses.chunked_smoothed_nll]: no float32 copy of the logits, nor of their
        log-probabilities, is kept).
    labels
        (B, T) long tensor; `ignore_index` marks positions that do not count.
    epsilon
        smoothing in [0, 1).

    Returns
    -------
    loss_sum :
        scalar, sum over counted tokens of the smoothed loss.
    nll_sum :
        scalar, sum over counted tokens of -log p(y_t) (equals `loss_sum` when `epsilon == 0`).
    num_tokens :
        scalar long tensor, the number of counted tokens.
    """
    logits = logits.reshape(-1, logits.shape[-1])  # (B*T, V)
    labels = labels.reshape(-1)
    num_tokens = labels.ne(ignore_index).sum()
    if logits.dtype in (torch.float16, torch.bfloat16):
        if ignore_index != IGNORE_INDEX:
            labels = labels.masked_fill(labels.eq(ignore_index), IGNORE_INDEX)
        loss_sum, nll_sum = chunked_smoothed_nll(logits, labels, epsilon)
        return loss_sum, nll_sum, num_tokens
    if epsilon == 0.0:
        nll_sum = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
        return nll_sum, nll_sum, num_tokens
    keep = labels.ne(ignore_index)
    lprobs = F.log_softmax(logits, dim=-1)
    nll = -lprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    nll_sum = (nll * keep).sum()
    loss_sum = ((1.0 - epsilon) * nll + epsilon * smooth).mul(keep).sum()
    return loss_sum, nll_sum, num_tokens


def total_objective(
    loss_sum: torch.Tensor,
    num_tokens: torch.Tensor,
    method_term: torch.Tensor | None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """The objective the optimizer sees: the token loss plus the methods' (already weighted) terms.

    Without `num_items_in_batch` this is `loss_sum / num_tokens + method_term`. When the Trainer passes
    `num_items_in_batch` (the label tokens of the whole accumulated, all-process batch), the token loss is divided by
    it, so gradient accumulation and DDP give exactly the gradient of one big batch; each method term, a mean over its
    micro-batch, is weighted by the micro-batch's share of tokens, `num_tokens / num_items_in_batch`, so the
    accumulated objective holds the token-weighted mean of the terms (equal to the full-batch term when the micro-
    batches carry equal token counts). A batch without label tokens gives 0, not NaN (the denominator is at least 1).
    """
    denominator = num_tokens if num_items_in_batch is None else num_items_in_batch
    denominator = denominator.clamp(min=1) if torch.is_tensor(denominator) else max(denominator, 1)
    loss = loss_sum / denominator
    if method_term is not None:
        loss = loss + method_term * (num_tokens / denominator)
    return loss


# ----------------------------------------------------------------------------------------------------------------
# The loss without the full logits. Two identities make it cheap:
#   -log p_v = lse - z_v, so mean_v(-log p_v) = lse - mean_v(z) and the smoothed loss is
#   loss_t = (1 - eps) * nll_t + eps * (lse_t - zbar_t) = nll_t + eps * (z_{t,y} - zbar_t);
#   z_{t,y} = h_t . W_y + b_y and zbar_t = h_t . mean_v(W_v) + mean_v(b_v) need no (N, V) tensor.
# ----------------------------------------------------------------------------------------------------------------

CHUNK_BYTES = 64 * 2**20
"""Rows of a chunk are chosen so that one chunk's float32 logits take about this many bytes (a (rows, V) buffer; the
forward holds about three of them with a gradient). Measured on the CPU (docs/results/benchmarks.md, "The loss
without the logits")."""


def chunk_rows(num_rows: int, vocab_size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows per chunk: `chunk_bytes` of float32 logits, at least 1, at most `num_rows`."""
    return max(1, min(num_rows, chunk_bytes // (4 * vocab_size)))


CUDA_CHUNK_BYTES = 512 * 2**20
"""On CUDA a chunk's float32 logits take about this many bytes: each chunk adds its (V, d) weight gradient into the
float32 sum (a read and a write of 4 V d bytes, 1 GiB at mBART's vocabulary), so few large chunks. The loss without
logits of mbart-large 8x512 took 2.08x stock's step on an H100 with 61 chunks of 64 MiB (torch 2.11, the logits
recomputed in the backward); 512 MiB gives 8 chunks. To be settled by `benchmarks/gpu.sh` (mbart-no-logits)."""


def chunk_bytes_for(device: torch.device) -> int:
    """The float32 bytes of one chunk's logits on `device`: [`CUDA_CHUNK_BYTES`][hf_headattn.losses.CUDA_CHUNK_BYTES] on
    CUDA, else [`CHUNK_BYTES`][hf_headattn.losses.CHUNK_BYTES]."""
    return CUDA_CHUNK_BYTES if device.type == "cuda" else CHUNK_BYTES


def smoothed_nll_terms(logits: torch.Tensor, labels: torch.Tensor, epsilon: float, ignore_index: int = IGNORE_INDEX):
    """Per-token terms of one chunk of (n, V) logits (computed in `logits`' dtype: pass float32 or float64).

    Returns `(loss (n,), nll (n,), lse (n,))`: `nll_t = lse_t - z_{t,y}`, `loss_t = nll_t + epsilon *
    (z_{t,y} - mean_v z_{t,v})` (= `(1 - eps) * nll_t + eps * mean_v(-log p_v)`), both 0 where `labels` is
    `ignore_index`; `lse_t = logsumexp_v z_{t,v}`, what the backward needs
    ([`smoothed_nll_grad`][hf_headattn.losses.smoothed_nll_grad])."""
    keep = labels.ne(ignore_index)
    lse = logits.logsumexp(-1)
    label_logit = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    nll = (lse - label_logit) * keep
    loss = nll + epsilon * (label_logit - logits.mean(-1)) * keep if epsilon else nll
    return loss, nll, lse


def smoothed_nll_grad(logits, lse, labels, epsilon, grad_loss, grad_nll, ignore_index: int = IGNORE_INDEX):
    """Gradient w.r.t. one chunk of (n, V) logits of `grad_loss * sum_t loss_t + grad_nll * sum_t nll_t`
    ([`smoothed_nll_terms`][hf_headattn.losses.smoothed_nll_terms]): `(grad_loss + grad_nll) * p - (grad_loss * (1 -
    eps) + grad_nll) * onehot(y) - grad_loss * eps / V` per counted row, 0 for an ignored one; `p = exp(z -
    lse)`. Overwrites `logits`."""
    keep = labels.ne(ignore_index).unsqueeze(-1)
    grad = logits.sub_(lse.unsqueeze(-1)).exp_().mul_(grad_loss + grad_nll)
    if epsilon:
        grad.sub_(grad_loss * epsilon / logits.shape[-1])
    grad.scatter_add_(-1, labels.clamp(min=0).unsqueeze(-1),
                      (-(grad_loss * (1.0 - epsilon) + grad_nll)).expand(labels.shape[0], 1).to(grad.dtype))
    return grad.mul_(keep)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunked_smoothed_nll(logits: torch.Tensor, labels: torch.Tensor, epsilon: float,
                         rows: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`(loss_sum, nll_sum)` of (N, V) half-precision logits (labels (N,)), computed in float32 chunk by chunk
    (`rows` a chunk, 0: [`chunk_rows`][hf_headattn.losses.chunk_rows]).

    What `label_smoothed_nll_loss` of half-precision logits uses instead of a float32 copy of all of them (and of
    their log-probabilities, which autograd would keep): it saves the logits themselves (the model returns them
    anyway) and the (N,) logsumexp, and recomputes each chunk's probabilities in the backward
    ([`smoothed_nll_grad`][hf_headattn.losses.smoothed_nll_grad]). Two custom operators, forward and backward, as
    [`chunked_linear_smoothed_nll`][hf_headattn.losses.chunked_linear_smoothed_nll] is one: `torch.compile` sees one
    operation each, not a loop over a number of chunks that each new length changes (as an `autograd.Function` it
    compiled a tiny model cast to bf16 again at every batch length: 5 graphs in 5 batches, against stock's 2)."""
    sums, _ = _SMOOTHED_NLL(logits, labels, float(epsilon), int(rows))
    return sums[0], sums[1]


def _smoothed_nll_forward(logits, labels, epsilon: float, rows: int):
    """`(sums, lse)`: sums (2,) = loss_sum and nll_sum, lse (N,), both in float32 (float64 for float64 logits)."""
    acc, rows = _accumulation_dtype(logits.dtype), rows or chunk_rows(*logits.shape)
    sums = torch.zeros(2, dtype=acc, device=logits.device)
    lse = torch.empty(logits.shape[0], dtype=acc, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        part = slice(start, start + rows)
        loss, nll, lse[part] = smoothed_nll_terms(logits[part].to(acc), labels[part], epsilon)
        sums += torch.stack([loss.sum(), nll.sum()])
    return sums, lse


def _smoothed_nll_fake(logits, labels, epsilon, rows):
    acc = _accumulation_dtype(logits.dtype)
    return logits.new_empty(2, dtype=acc), logits.new_empty(logits.shape[0], dtype=acc)


def _smoothed_nll_backward(logits, labels, lse, grad_sums, epsilon: float, rows: int):
    """The gradient w.r.t. the (N, V) logits of `grad_sums . (loss_sum, nll_sum)`, in the logits' dtype."""
    rows = rows or chunk_rows(*logits.shape)
    grad = torch.empty_like(logits)
    for start in range(0, logits.shape[0], rows):
        part = slice(start, start + rows)
        grad[part] = smoothed_nll_grad(logits[part].to(lse.dtype, copy=True), lse[part], labels[part], epsilon,
                                       grad_sums[0], grad_sums[1])
    return grad


def _smoothed_nll_setup_context(ctx, inputs, output):
    logits, labels, epsilon, rows = inputs
    ctx.save_for_backward(logits, labels, output[1])
    ctx.epsilon, ctx.rows = epsilon, rows


def _smoothed_nll_grads(ctx, grad_sums, grad_lse):
    logits, labels, lse = ctx.saved_tensors
    if grad_sums is None or not ctx.needs_input_grad[0]:
        return None, None, None, None
    return _SMOOTHED_NLL_BACKWARD(logits, labels, lse, grad_sums, ctx.epsilon, ctx.rows), None, None, None


def chunked_linear_smoothed_nll(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                labels: torch.Tensor, epsilon: float, rows: int = 0) -> tuple[torch.Tensor, ...]:
    """`(loss_sum, nll_sum)` of the logits `hidden @ weight.T + bias` (hidden (N, d), labels (N,)), chunk by chunk
    over the N rows (`rows` a chunk, 0: [`chunk_rows`][hf_headattn.losses.chunk_rows]): the (N, V) logits never exist.

    When a gradient is wanted, the forward computes it too, as torch's op and Liger Kernel do: each chunk's logits
    once (one (n, d) x (d, V) product in the inputs' dtype, i.e. autocast's), their float32 statistics and gradient
    ([`smoothed_nll_grad`][hf_headattn.losses.smoothed_nll_grad]), then the gradients of `hidden` (n, d, in its dtype)
    and `weight` (summed over the chunks in float32, [`add_weight_grad`][hf_headattn.losses.add_weight_grad]), two more
    products in the inputs' dtype. The backward only scales the kept gradients of `loss_sum`
    ([`scale_kept_grads`][hf_headattn.losses.scale_kept_grads]); in evaluation (no grad) nothing of it is done. Our own,
    used where `torch.nn.functional.linear_cross_entropy` cannot be (see
    [`linear_label_smoothed_nll_loss`][hf_headattn.losses.linear_label_smoothed_nll_loss]). A custom operator, as
    torch's is: `torch.compile` sees one operation, not a loop over a number of chunks that each new length changes (an
    `autograd.Function` compiled a tiny model again at every batch length under bf16 autocast)."""
    need = torch.is_grad_enabled() and hidden.requires_grad, torch.is_grad_enabled() and weight.requires_grad, \
        torch.is_grad_enabled() and bias is not None and bias.requires_grad
    sums, *_ = _LINEAR_NLL(hidden, weight, bias, labels, float(epsilon), int(rows), *need)
    return sums[0], sums[1]


def _linear_nll_forward(hidden, weight, bias, labels, epsilon: float, rows: int, need_hidden: bool,
                        need_weight: bool, need_bias: bool):
    """`(sums, grad_hidden, grad_weight, grad_bias)`: sums (2,) = loss_sum and nll_sum in float32 (float64 for
    float64 inputs); the gradients of `loss_sum` (an empty tensor where not needed): hidden's in its dtype,
    weight's and bias's in the sums' dtype."""
    acc, rows = _accumulation_dtype(hidden.dtype), rows or chunk_rows(hidden.shape[0], weight.shape[0],
                                                                      chunk_bytes_for(hidden.device))
    sums = torch.zeros(2, dtype=acc, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if need_hidden else hidden.new_empty(0)
    grad_weight = torch.zeros_like(weight, dtype=acc) if need_weight else hidden.new_empty(0, dtype=acc)
    grad_bias = torch.zeros_like(bias, dtype=acc) if need_bias else hidden.new_empty(0, dtype=acc)
    one, zero = torch.ones((), dtype=acc, device=hidden.device), torch.zeros((), dtype=acc, device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        part = slice(start, start + rows)
        logits = F.linear(hidden[part], weight, bias).to(acc)
        loss, nll, lse = smoothed_nll_terms(logits, labels[part], epsilon)
        sums += torch.stack([loss.sum(), nll.sum()])
        if not (need_hidden or need_weight or need_bias):
            continue
        grad = smoothed_nll_grad(logits, lse, labels[part], epsilon, one, zero)  # (n, V), float32, in place
        if need_bias:
            grad_bias += grad.sum(0)
        grad = grad.to(hidden.dtype)  # what the logits path's products multiply
        if need_hidden:
            torch.mm(grad, weight, out=grad_hidden[part])
        if need_weight:
            add_weight_grad(grad_weight, grad, hidden[part])
    return sums, grad_hidden, grad_weight, grad_bias


def scale_kept_grads(grad_sums, grads, hidden, weight, labels, epsilon: float):
    """The gradients of `grad_sums . (loss_sum, nll_sum)` from the kept gradients `grads` of `loss_sum`
    (hidden's, weight's, bias's; None where not wanted) without a product of the logits: `nll_t = loss_t - eps *
    (z_{t,y} - mean_v z_{t,v})`, whose logits' gradient `eps * (1/V - onehot(y))` per counted row is (n, d)
    and (V,) work: `eps * (mean_v W_v - W_y)` for `h_t`, `eps * (s / V - sum_{t: y_t = v} h_t)` for `W_v`
    (`s`: the counted rows' sum), `eps * (n / V - count_v)` for `b_v`. Hidden's gradient in its dtype, the
    weight's and bias's in the weight's dtype, each rounded once from float32."""
    grad_loss, grad_nll = grad_sums[0], grad_sums[1]
    grad_hidden, grad_weight, grad_bias = grads
    scale, correction = grad_loss + grad_nll, grad_nll * epsilon
    keep = labels.ne(IGNORE_INDEX).unsqueeze(-1)
    target, vocab = labels.clamp(min=0), weight.shape[0]
    counted = hidden.to(scale.dtype) * keep if epsilon and (grad_weight is not None) else None
    if grad_hidden is not None:
        grad_hidden = grad_hidden.to(scale.dtype) * scale
        if epsilon:
            offset = weight.mean(0, dtype=scale.dtype) - weight.index_select(0, target).to(scale.dtype)
            grad_hidden = grad_hidden + (correction * offset) * keep
        grad_hidden = grad_hidden.to(hidden.dtype)
    if grad_weight is not None:
        if epsilon:
            grad_weight = torch.addcmul((correction / vocab) * counted.sum(0), grad_weight, scale)
            grad_weight = grad_weight.index_add_(0, target, counted * -correction)
        else:
            grad_weight = grad_weight * scale
        grad_weight = grad_weight.to(weight.dtype)
    if grad_bias is not None:
        if epsilon:
            count = torch.zeros_like(grad_bias).index_add_(0, target, keep.squeeze(-1).to(grad_bias.dtype))
            grad_bias = torch.addcmul(correction * (keep.sum().to(count.dtype) / vocab - count), grad_bias, scale)
        else:
            grad_bias = grad_bias * scale
        grad_bias = grad_bias.to(weight.dtype)
    return grad_hidden, grad_weight, grad_bias


def _linear_nll_fake(hidden, weight, bias, labels, epsilon, rows, need_hidden, need_weight, need_bias):
    acc = _accumulation_dtype(hidden.dtype)
    return (hidden.new_empty(2, dtype=acc), torch.empty_like(hidden) if need_hidden else hidden.new_empty(0),
            torch.empty_like(weight, dtype=acc) if need_weight else hidden.new_empty(0, dtype=acc),
            torch.empty_like(bias, dtype=acc) if need_bias else hidden.new_empty(0, dtype=acc))


def _linear_nll_setup_context(ctx, inputs, output):
    hidden, weight, bias, labels, epsilon, _, need_hidden, need_weight, need_bias = inputs
    _, grad_hidden, grad_weight, grad_bias = output
    ctx.save_for_backward(hidden, weight, labels, grad_hidden, grad_weight, grad_bias)
    ctx.epsilon, ctx.need = epsilon, (need_hidden, need_weight, need_bias)


def _linear_nll_grads(ctx, grad_sums, *grads_of_grads):
    hidden, weight, labels, *kept = ctx.saved_tensors
    need = tuple(kept_need and wanted for kept_need, wanted in zip(ctx.need, ctx.needs_input_grad))
    if grad_sums is None or not any(need):
        return (None,) * 9
    grads = scale_kept_grads(grad_sums, [grad if wanted else None for grad, wanted in zip(kept, need)], hidden,
                             weight, labels, ctx.epsilon)
    return *grads, None, None, None, None, None, None


def _custom_op(name: str, function, schema: str, fake):
    """`function` as the operator `hf_headattn::<name>_<this module's name>`: unique to this copy of the code (a
    checkpoint's remote code brings its own, as for `ATTENTION_NAME`)."""
    module = re.sub(r"\W", "_", __name__)
    op = torch.library.custom_op(f"hf_headattn::{name}_{module}", function, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


_LINEAR_NLL = _custom_op(
    "linear_smoothed_nll_with_grads", _linear_nll_forward,
    "(Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, float epsilon, int rows, bool need_hidden, "
    "bool need_weight, bool need_bias) -> (Tensor, Tensor, Tensor, Tensor)",
    _linear_nll_fake)
_LINEAR_NLL.register_autograd(_linear_nll_grads, setup_context=_linear_nll_setup_context)
_SMOOTHED_NLL = _custom_op(
    "chunked_smoothed_nll", _smoothed_nll_forward,
    "(Tensor logits, Tensor labels, float epsilon, int rows) -> (Tensor, Tensor)", _smoothed_nll_fake)
_SMOOTHED_NLL_BACKWARD = _custom_op(
    "chunked_smoothed_nll_backward", _smoothed_nll_backward,
    "(Tensor logits, Tensor labels, Tensor lse, Tensor grad_sums, float epsilon, int rows) -> Tensor",
    lambda logits, *_: torch.empty_like(logits))
_SMOOTHED_NLL.register_autograd(_smoothed_nll_grads, setup_context=_smoothed_nll_setup_context)


def add_weight_grad(grad_weight: torch.Tensor, grad: torch.Tensor, hidden: torch.Tensor) -> None:
    """`grad_weight += grad.T @ hidden` for one chunk: the product in `hidden`'s dtype (`grad` is already
    rounded to it, what the logits path's one (V, N) x (N, d) product multiplies; half precision: bf16 inputs,
    float32 accumulation inside the product, as autocast's matmul), summed over the chunks in `grad_weight`'s
    float32, so the result is rounded to the weight's dtype once per chunk's product, never summed in bf16. Summed in
    bf16 chunk by chunk, the tied embedding's gradient of a tiny mBART under bf16 autocast was 0.47% off the logits
    path's (20 chunks), against 0.19% between stock steps taken whole and in two micro-batches."""
    if grad_weight.dtype == hidden.dtype:
        grad_weight.addmm_(grad.T, hidden)
    else:
        grad_weight += grad.T @ hidden


def _torch_linear_cross_entropy(hidden: torch.Tensor):
    """`torch.nn.functional.linear_cross_entropy` and its options class, or None where torch lacks them (before
    2.13, the oldest `pyproject` declares, e.g. 2.11 on the lent GPUs) or `hidden` is half precision: then
    [`chunked_linear_smoothed_nll`][hf_headattn.losses.chunked_linear_smoothed_nll] computes the loss. Torch's computes
    the gradients in its forward, as ours does, but cannot smooth labels in its chunked path (the identity in
    [`linear_label_smoothed_nll_loss`][hf_headattn.losses.linear_label_smoothed_nll_loss] adds it). Of bf16 inputs
    (torch 2.13) it sums the loss and the weight's gradient in bf16 across chunks, and scales its gradients of the sum
    in bf16: under bf16 autocast a tiny mBART's loss was 0.17-0.20% off the logits path's (`eval_loss`, early stopping
    and model selection would differ by path) and its gradients 0.36-0.60% (stock steps, whole and in two micro-batches:
    0.17%)."""
    return None if hidden.dtype in (torch.float16, torch.bfloat16) else linear_cross_entropy()


def linear_label_smoothed_nll_loss(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
    epsilon: float = 0.0, rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[`label_smoothed_nll_loss`][hf_headattn.losses.label_smoothed_nll_loss] of the logits `hidden @ weight.T + bias`,
    without computing them all.

    Parameters
    ----------
    hidden
        (..., d) tensor, e.g. the decoder's (B, T, d) final hidden states.
    weight
        (V, d) output projection (the LM head's weight); bias: (V,) or None.
    labels
        (...) long tensor, `IGNORE_INDEX` where a position does not count.
    epsilon
        label smoothing in [0, 1).
    rows
        rows per chunk; default [`chunk_rows`][hf_headattn.losses.chunk_rows].

    Returns
    -------
    :
        `(loss_sum, nll_sum, num_tokens)` as [`label_smoothed_nll_loss`][hf_headattn.losses.label_smoothed_nll_loss]
        does (float32 sums; float64 for float64 inputs). For float32 and float64 inputs, where torch has
        `F.linear_cross_entropy` (torch >= 2.13), its chunked path gives `nll_sum` (it computes the gradients in its
        forward, so no matmul is repeated) and the smoothing term is added by the identity
        `loss_t = nll_t + eps * (z_{t,y} - mean_v z_{t,v})`, whose two logits are (n, d) dot products; elsewhere,
        half-precision inputs included (torch's sums them in their dtype, `_torch_linear_cross_entropy`),
        [`chunked_linear_smoothed_nll`][hf_headattn.losses.chunked_linear_smoothed_nll] computes both sums in float32,
        the values of the logits path. Under autocast the inputs are cast to its dtype first, as `F.linear` would be.
    """
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    num_tokens = labels.ne(IGNORE_INDEX).sum()
    torch_path = _torch_linear_cross_entropy(hidden)
    if torch_path is None:  # (its chunk rows chosen inside, from the lengths: no guard of a compiled graph)
        loss_sum, nll_sum = chunked_linear_smoothed_nll(hidden, weight, bias, labels, epsilon, rows or 0)
        return loss_sum, nll_sum, num_tokens
    function, options = torch_path
    rows = rows or chunk_rows(hidden.shape[0], weight.shape[0])
    # allow_retain_graph under torch.compile: what torch would force, with a warning that breaks the graph
    nll_sum = function(hidden, weight, labels, linear_bias=bias, reduction="sum", ignore_index=IGNORE_INDEX,
                       options=options(batch_chunk_size=rows, allow_retain_graph=torch.compiler.is_compiling()))
    nll_sum = nll_sum.to(_accumulation_dtype(nll_sum.dtype))
    if not epsilon:
        return nll_sum, nll_sum, num_tokens
    return nll_sum + epsilon * label_minus_mean_logit_sum(hidden, weight, bias, labels), nll_sum, num_tokens


def label_minus_mean_logit_sum(hidden, weight, bias, labels) -> torch.Tensor:
    """`sum_t [y_t counts] (z_{t,y_t} - mean_v z_{t,v})` for `z = hidden @ weight.T + bias` (hidden (N, d),
    labels (N,)), in float32 or float64, from (N, d) and (V,) products only: `z_{t,y} = h_t . W_y + b_y` and
    `sum_t mean_v z_{t,v} = mean_v(W_v . s) + n * mean_v(b_v)` with `s = sum_t h_t` over the n counted rows."""
    acc = _accumulation_dtype(hidden.dtype)
    keep = labels.ne(IGNORE_INDEX)
    counted = hidden.to(acc) * keep.unsqueeze(-1)  # (N, d)
    target = labels.clamp(min=0)
    # (V, d) @ (d,) in the weight's dtype: no float32 copy of the weight, nor of its gradient
    mean_logit = (weight @ counted.sum(0).to(weight.dtype)).to(acc).mean()
    total = (counted * weight.index_select(0, target).to(acc)).sum() - mean_logit
    if bias is not None:
        total = total + (bias.index_select(0, target).to(acc) * keep).sum() - keep.sum() * bias.to(acc).mean()
    return total
