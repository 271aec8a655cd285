"""Relative positions (Shaw et al. 2018): the pure functions and the attention function of a tiny model's layer
against float64 loops over (sentence, head, query, key) that read none of the package's code; gradcheck of the pure
functions; SEA's mask and the relative terms on one layer."""

import pytest
import torch

from conftest import TINY
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.attention import headattn_attention_forward
from hf_headattn.methods.rel_pos import core
from hf_headattn.methods.rel_pos.equations import (
    key_term,
    label_sums,
    relative_attention,
    relative_labels,
    value_term,
)

B, H, T, D, K = 2, 4, 5, 4, 2
REAL = torch.tensor([[True] * 5, [True, True, True, False, False]])  # (B, S): sentence 1 has 3 real tokens
SCALING = D ** -0.5


def clip_label(i, j, k=K):
    return min(max(j - i, -k), k) + k


def test_labels_key_and_value_terms_are_the_loops():
    """With 3 queries, the last 3 of 5 positions (a cache offset of 2)."""
    g = torch.Generator().manual_seed(0)
    query, probs = torch.randn(B, H, 3, D, generator=g), torch.rand(B, H, 3, T, generator=g)
    keys, values = torch.randn(2 * K + 1, D, generator=g), torch.randn(2 * K + 1, D, generator=g)
    labels = relative_labels(3, T, K)
    assert labels.tolist() == [[clip_label(i + 2, j) for j in range(T)] for i in range(3)]
    by_loop = torch.tensor([[[[query[b, h, i] @ keys[clip_label(i + 2, j)] for j in range(T)] for i in range(3)]
                             for h in range(H)] for b in range(B)])
    torch.testing.assert_close(key_term(query, keys, labels), by_loop)
    by_loop = torch.stack([torch.stack([torch.stack([sum(probs[b, h, i, j] * values[clip_label(i + 2, j)]
                                                         for j in range(T)) for i in range(3)])
                                        for h in range(H)]) for b in range(B)])
    torch.testing.assert_close(value_term(probs, values, labels), by_loop)
    assert label_sums(probs, labels, 2 * K + 1).sum(-1).allclose(probs.sum(-1))


def test_per_head_tables_are_the_loops():
    """A table per head (H, 2k+1, D): head h reads its own table only."""
    g = torch.Generator().manual_seed(3)
    query, probs = torch.randn(B, H, T, D, generator=g), torch.rand(B, H, T, T, generator=g)
    keys, values = torch.randn(H, 2 * K + 1, D, generator=g), torch.randn(H, 2 * K + 1, D, generator=g)
    labels = relative_labels(T, T, K)
    by_loop = torch.tensor([[[[query[b, h, i] @ keys[h, clip_label(i, j)] for j in range(T)] for i in range(T)]
                             for h in range(H)] for b in range(B)])
    torch.testing.assert_close(key_term(query, keys, labels), by_loop)
    by_loop = torch.stack([torch.stack([torch.stack([sum(probs[b, h, i, j] * values[h, clip_label(i, j)]
                                                         for j in range(T)) for i in range(T)])
                                        for h in range(H)]) for b in range(B)])
    torch.testing.assert_close(value_term(probs, values, labels), by_loop)


@pytest.mark.parametrize("per_head", [False, True])
def test_the_pure_functions_gradcheck(per_head):
    """float64 gradcheck through the key term's gather and the value term's scatter-add (tables included), and of
    relative_attention, which equals their composition."""
    g = torch.Generator().manual_seed(1)
    labels = relative_labels(T, T, K)
    table = (H, 2 * K + 1, D) if per_head else (2 * K + 1, D)
    inputs = [torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
              for shape in ((B, H, T, D), table, (B, H, T, T), table)]
    assert torch.autograd.gradcheck(lambda q, w: key_term(q, w, labels), inputs[:2])
    assert torch.autograd.gradcheck(lambda q, w: key_term(q, w, labels, 0.125), inputs[:2])
    torch.testing.assert_close(key_term(*inputs[:2], labels, 0.125), key_term(*inputs[:2], labels) * 0.125)
    assert torch.autograd.gradcheck(lambda p, w: value_term(p, w, labels), inputs[2:])
    # both terms in one Function (the layer's path): the composition of the pure functions, in values and gradients
    # (the weights' too), with a bool, a trainable float and no mask; gradcheck; a row that allows no key
    query, key, value = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64).requires_grad_()
                         for _ in range(3))
    w_k, w_v = inputs[1], inputs[3]
    allowed = REAL[:, None, None, :].expand(B, 1, T, T).clone()
    additive = torch.randn(B, H, T, T, generator=g, dtype=torch.float64).masked_fill(~allowed, -1e300)
    for mask in (allowed, additive.requires_grad_(), None):
        tensors = (query, key, value, w_k, w_v) + ((mask,) if mask is not None and mask.requires_grad else ())
        ours = relative_attention(query, key, value, w_k, w_v, labels, mask, 0.3)
        expected = composed(query, key, value, w_k, w_v, labels, mask, 0.3)
        upstream = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in expected]
        for a, b in zip(ours, expected):
            torch.testing.assert_close(a, b)
        for a, b in zip(torch.autograd.grad(ours, tensors, upstream), torch.autograd.grad(expected, tensors, upstream)):
            torch.testing.assert_close(a, b)
        if mask is allowed:
            assert torch.autograd.gradcheck(lambda *x: relative_attention(*x, labels, mask, 0.3), tensors)
    allowed[1, 0, 2] = False  # a row that allows no key: the key term gets no gradient from it, as with where
    ours, expected = (f(query, key, value, w_k, w_v, labels, allowed, 0.3)[0] for f in (relative_attention, composed))
    for a, b in zip(torch.autograd.grad(ours, w_k, upstream[0]), torch.autograd.grad(expected, w_k, upstream[0])):
        torch.testing.assert_close(a, b)


def composed(query, key, value, w_k, w_v, labels, mask, scaling):
    """Shaw et al.'s attention from the pure functions, as the layer composed them before (the key term masked by
    where, alpha by the shared helper)."""
    from hf_headattn.probabilities import attention_probabilities

    bias = key_term(query, w_k, labels, scaling)
    if mask is not None and mask.dtype == torch.bool:
        bias = torch.where(mask, bias, torch.finfo(bias.dtype).min)
    elif mask is not None:
        bias = bias + mask
    probs = attention_probabilities(query, key, scaling, bias)
    return probs @ value + value_term(probs, w_v, labels), probs


def module_of(backend, side="encoder", **settings):
    """Layer 0's self-attention of a tiny model with rel_pos there (k = 2, random tables), on ``backend``."""
    torch.manual_seed(0)
    placed = {"encoder_layers": [0] if side == "encoder" else [], **({"decoder_layers": [0]} if side == "decoder"
                                                                     else {})}
    config = HeadAttnMBartConfig(**TINY, attention_dropout=0.0,
                                 rel_pos={"max_relative_position": K, **placed, **settings})
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    model.set_attn_implementation(backend)
    module = getattr(model.model, side).layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    for table in module.rel_pos.parameters():
        table.data.copy_(torch.randn(table.shape, generator=g))
    return module


def qkv(dtype=torch.float32, length=T, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, length, D, generator=g, dtype=dtype)
    return [query, *(torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(2))]


def call_mask(backend, side, length=T):
    """What transformers passes: encoder padding (bool for SDPA, finfo.min for eager); decoder causality (None on
    SDPA without a cache: is_causal; one query with a cache: None; several after a cache: the explicit mask)."""
    allowed = allowed_keys(side)[:, None, T - length:]  # (B, 1, t, S)
    if (side == "decoder" and backend == "sdpa" and length == T) or length == 1:
        return None
    return allowed if backend == "sdpa" else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo().min)


def allowed_keys(side):
    if side == "encoder":
        return REAL[:, None, :].expand(B, T, T)
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)


def reference(query, key, value, allowed, w_k, w_v, chosen=None, hard=None):
    """Shaw et al.'s attention in float64 by loops: the queries are the last t of the S positions; ``chosen`` (B, H)
    the sentence-heads that get the relative terms (None: all); ``hard`` (B, S, S) another method's hard mask (on the
    same sentence-heads)."""
    query, key, value = (tensor.detach().double() for tensor in (query, key, value))
    w_k, w_v = w_k.detach().double(), None if w_v is None else w_v.detach().double()
    length, offset = query.shape[2], T - query.shape[2]
    out = torch.zeros(B, length, H, D, dtype=torch.float64)
    tables_k, tables_v = w_k, w_v  # (L, D), or (H, L, D): a table per head
    for b in range(B):
        for h in range(H):
            w_k = tables_k[h] if tables_k.dim() == 3 else tables_k
            w_v = tables_v[h] if tables_v is not None and tables_v.dim() == 3 else tables_v
            on = chosen is None or bool(chosen[b, h])
            for i in range(length):
                position = i + offset
                scores = []
                for j in range(T):
                    k_j = key[b, h, j] + (w_k[clip_label(position, j)] if on else 0)
                    scores.append(query[b, h, i] @ k_j * SCALING)
                keep = allowed[b, position].clone()
                if on and hard is not None and (hard[b, position] & keep).any():
                    keep &= hard[b, position]
                probs = torch.stack(scores).masked_fill(~keep, float("-inf")).softmax(-1)
                for j in range(T):
                    v_j = value[b, h, j] + (w_v[clip_label(position, j)] if on and w_v is not None else 0)
                    out[b, i, h] += probs[j] * v_j
    return out


def tables(module):
    return module.rel_pos.relative_keys, module.rel_pos.relative_values


@pytest.mark.parametrize("tables_", ["head", "layer"])
@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_the_layer_is_the_loop(backend, side, values, tables_):
    """Padding masks (encoder) and causality (decoder); the key term alone leaves the backend's path (no take-over);
    a table per head or per layer."""
    module = module_of(backend, side, values=values, tables=tables_)
    query, key, value = qkv()
    output, _ = headattn_attention_forward(module, query, key, value, call_mask(backend, side), scaling=SCALING)
    expected = reference(query, key, value, allowed_keys(side), *tables(module))
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length", [1, 2])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_queries_after_a_cache_sit_at_the_last_positions(backend, length):
    """Decoder self-attention with a key-value cache: ``length`` new queries over 5 keys are positions 5 - length..4,
    the rows of the full call's output."""
    module = module_of(backend, "decoder")
    query, key, value = qkv(length=length)
    output, _ = headattn_attention_forward(module, query, key, value, call_mask(backend, "decoder", length),
                                           scaling=SCALING)
    expected = reference(query, key, value, allowed_keys("decoder"), *tables(module))
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_queries_of_a_static_cache_take_their_positions_from_the_mask(backend):
    """Two queries at positions 2 and 3 over a static cache of 7 slots, 5 of them filled (the last two empty, masked):
    the rows of the full call's output at those positions."""
    module = module_of(backend, "decoder")
    query, key, value = qkv(length=2)
    empty = torch.randn(B, H, 2, D, generator=torch.Generator().manual_seed(9))
    key_slots, value_slots = torch.cat([key[:, :, :4], empty], 2), torch.cat([value[:, :, :4], empty], 2)  # (B, H, 6)
    allowed = torch.ones(6, dtype=torch.bool)[None, :] & (torch.arange(6)[None, :] <= torch.tensor([2, 3])[:, None])
    mask = allowed[None, None].expand(B, 1, 2, 6)
    if backend == "eager":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo().min)
    output, _ = headattn_attention_forward(module, query, key_slots, value_slots, mask, scaling=SCALING)
    full_query = torch.cat([torch.zeros(B, H, 2, D), query, torch.zeros(B, H, 1, D)], 2)  # positions 2, 3 of 5
    expected = reference(full_query, key, value, allowed_keys("decoder"), *tables(module))[:, 2:4]
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_the_layer_gradchecks(backend):
    """float64 gradcheck of the attention function (q, k, v and both tables), key term and value term."""
    module = module_of(backend).double()
    query, key, value = (tensor.requires_grad_() for tensor in qkv(torch.float64))
    mask = call_mask(backend, "encoder")
    if mask.dtype != torch.bool:
        mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(mask < 0, torch.finfo(torch.float64).min)
    method = module.rel_pos
    w_k, w_v = (table.detach().clone().requires_grad_() for table in tables(module))

    def attention(query, key, value, w_k, w_v):
        del method.relative_keys, method.relative_values
        method.relative_keys, method.relative_values = w_k, w_v
        return headattn_attention_forward(module, query, key, value, mask, scaling=SCALING)[0]

    assert torch.autograd.gradcheck(attention, (query, key, value, w_k, w_v))


def test_the_selection_of_redundant_heads_is_per_sentence(monkeypatch):
    """head_selection="redundant" with a hand-made selection (RHE monkeypatched): the key and value terms on the chosen
    sentence-heads only, the others plain attention."""
    chosen = torch.tensor([[True, False, False, True], [False, True, False, False]])
    seen = {}

    def hand_made(call, dependency_mask):
        seen["dependency_mask"] = dependency_mask
        return chosen

    monkeypatch.setattr(core, "redundant_heads_of", hand_made)
    module = module_of("sdpa", head_selection="redundant")
    query, key, value = qkv()
    dependency = torch.eye(T, dtype=torch.bool).expand(B, T, T)
    output, _ = headattn_attention_forward(module, query, key, value, call_mask("sdpa", "encoder"),
                                           scaling=SCALING, dependency_mask=dependency)
    assert seen["dependency_mask"] is dependency
    expected = reference(query, key, value, allowed_keys("encoder"), *tables(module), chosen=chosen)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_with_sea_on_one_layer_both_apply(backend, values):
    """SEA's DEA hard mask and the relative terms on layer 0, every head: both apply (the shared layer adds them;
    SEA's mask reaches the taken-over heads)."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, attention_dropout=0.0,
                                 sea={"type": "dea", "head_selection": "all", "encoder_layers": [0]},
                                 rel_pos={"max_relative_position": K, "encoder_layers": [0], "values": values})
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    model.set_attn_implementation(backend)
    module = model.model.encoder.layers[0].self_attn
    assert module.headattn_methods == ("sea", "rel_pos")
    g = torch.Generator().manual_seed(2)
    for table in module.rel_pos.parameters():
        table.data.copy_(torch.randn(table.shape, generator=g))
    dependency = (torch.rand(B, T, T, generator=g) < 0.4) | torch.eye(T, dtype=torch.bool)
    query, key, value = qkv()
    output, _ = headattn_attention_forward(module, query, key, value, call_mask(backend, "encoder"),
                                           scaling=SCALING, dependency_mask=dependency)
    expected = reference(query, key, value, allowed_keys("encoder"), *tables(module), hard=dependency)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_with_sea_both_on_the_redundant_heads_rhe_runs_once(monkeypatch):
    """SEA's DEA+RHE and Rel_Pos+RHE on one layer: RHE's plain attention is computed once for the call (by SEA, before
    its mask), and both apply to the heads it selects."""
    from hf_headattn import redundancy

    torch.manual_seed(0)
    config = HeadAttnMBartConfig(
        **TINY, attention_dropout=0.0, sea={"type": "dea", "head_selection": "redundant", "encoder_layers": [0]},
        rel_pos={"max_relative_position": K, "encoder_layers": [0], "head_selection": "redundant"})
    module = HeadAttnMBartForConditionalGeneration(config).eval().model.encoder.layers[0].self_attn
    g = torch.Generator().manual_seed(2)
    for table in module.rel_pos.parameters():
        table.data.copy_(torch.randn(table.shape, generator=g))
    dependency = (torch.rand(B, T, T, generator=g) < 0.4) | torch.eye(T, dtype=torch.bool)
    calls = []
    plain = redundancy.attention_probabilities
    monkeypatch.setattr(redundancy, "attention_probabilities",
                        lambda *args, **kwargs: calls.append(1) or plain(*args, **kwargs))
    query, key, value = qkv()
    mask = call_mask("sdpa", "encoder")
    output, _ = headattn_attention_forward(module, query, key, value, mask, scaling=SCALING,
                                           dependency_mask=dependency)
    assert len(calls) == 1
    probs = plain(query, key, SCALING, mask, dtype=torch.float32)
    chosen = redundancy.redundant_heads(redundancy.head_confidence(probs, REAL),
                                        redundancy.syntactic_attention(probs, dependency, REAL))
    assert chosen.any() and not chosen.all()
    expected = reference(query, key, value, allowed_keys("encoder"), *tables(module), chosen=chosen, hard=dependency)
    torch.testing.assert_close(output.double(), expected, atol=1e-5, rtol=1e-5)


def test_probabilities_with_a_mask_of_every_head_are_the_shared_helpers():
    """The value term's alpha from one baddbmm (a float mask of every head, the key term in it): the shared helper's
    values and gradients (float64, gradcheck), and the helper itself for a mask shared by the heads."""
    from hf_headattn.methods.rel_pos.core import _probabilities
    from hf_headattn.probabilities import attention_probabilities

    g = torch.Generator().manual_seed(5)
    query, key = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    mask = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    mask[0, :, :, -1] = torch.finfo(torch.float64).min
    mask.requires_grad_()
    upstream = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
    got, want = _probabilities(query, key, 0.3, mask), attention_probabilities(query, key, 0.3, mask)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (query, key, mask), upstream),
                    torch.autograd.grad(want, (query, key, mask), upstream)):
        torch.testing.assert_close(a, b)
    finite = mask.detach().clamp(min=-5).requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k, m: _probabilities(q, k, 0.3, m), (query, key, finite))
    shared = torch.randn(B, 1, T, T, generator=g, dtype=torch.float64)
    by_helper = attention_probabilities(query, key, 0.3, shared)
    torch.testing.assert_close(_probabilities(query, key, 0.3, shared), by_helper)
