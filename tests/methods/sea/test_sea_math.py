"""SEA + RHE pure functions (Zhang et al. 2021, Eq. 3, 5, 8, 9, 10; RHE's in the shared hf_headattn.redundancy)
against numpy loops, no NaN, gradcheck; the mask
SEA's score bias gives SDPA/eager through the shared layer (Eq. 4 / Eq. 6) against a loop."""

import numpy as np
import pytest
import torch

from hf_headattn.attention import key_allowed
from hf_headattn.methods.sea.equations import lpea_bias, lpea_label_bias, sum_per_label
from hf_headattn.probabilities import attention_probabilities
from hf_headattn.redundancy import (
    dependency_allowed,
    head_confidence,
    head_statistics,
    real_tokens,
    redundant_heads,
    syntactic_attention,
)
from hf_headattn.scores import biased_mask, score_bias
from hf_headattn.syntax_inputs import NOT_IN_PHRASE

B, H, T, D, K = 3, 4, 6, 5, 2
LENGTHS = [6, 4, 1]  # the last sentence is a single token


def setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    real = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, T)
    probs = torch.rand(B, H, T, T, generator=g).softmax(-1).double()
    dep = torch.rand(B, T, T, generator=g) < 0.3
    dep = (dep | dep.transpose(1, 2)) & real[:, :, None] & real[:, None, :]  # contract: padding relates to itself only
    rp = torch.randint(-4, 5, (B, T, T), generator=g)
    outside = (torch.rand(B, T, T, generator=g) < 0.3) | ~(real[:, :, None] & real[:, None, :])
    rp[outside] = NOT_IN_PHRASE
    return real, probs, dep, rp, g


def enhanced_mask(attention_mask, syntax_bias, syntax_allowed, selected, dtype):
    """The additive mask SEA's ``before`` gives SDPA/eager (``call.add_score_bias(P[:, None],
    allowed=allowed[:, None], heads=selected)``): the shared layer's mask of Eq. 4 / Eq. 6 on the selected heads."""
    shape = (syntax_bias.shape[0], H, *syntax_bias.shape[1:])
    term = score_bias("sea", syntax_bias[:, None], syntax_allowed[:, None], selected, shape)
    return biased_mask(attention_mask, [term], dtype)


def test_head_confidence_eq3_and_syntactic_attention_eq9_match_loops():
    real, probs, dep, _, _ = setup()
    p, d = probs.numpy(), dep.numpy()
    conf, syn = np.zeros((B, H)), np.zeros((B, H))
    for b in range(B):
        n = LENGTHS[b]
        for h in range(H):
            conf[b, h] = sum(max(p[b, h, i, :]) for i in range(n)) / n
            syn[b, h] = sum(p[b, h, i, j] for i in range(n) for j in range(T) if d[b, i, j] or i == j) / n
    torch.testing.assert_close(head_confidence(probs, real), torch.from_numpy(conf))
    torch.testing.assert_close(syntactic_attention(probs, dep, real), torch.from_numpy(syn))
    # without a query mask every row counts
    torch.testing.assert_close(head_confidence(probs), probs.amax(-1).mean(-1))
    # both at once (what RHE runs): the same values, float64 in, float64 out
    conf_at_once, syn_at_once = head_statistics(probs, dep, real)
    assert conf_at_once.dtype == syn_at_once.dtype == torch.float64
    torch.testing.assert_close(conf_at_once, torch.from_numpy(conf))
    torch.testing.assert_close(syn_at_once, torch.from_numpy(syn))
    for got, expected in zip(head_statistics(probs, dep), (head_confidence(probs), syntactic_attention(probs, dep))):
        torch.testing.assert_close(got, expected)


def test_head_statistics_run_in_float32_under_autocast():
    real, probs, dep, _, _ = setup()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        conf, syn = head_statistics(probs.float(), dep, real)
    assert conf.dtype == syn.dtype == torch.float32
    torch.testing.assert_close(syn, syntactic_attention(probs, dep, real).float(), atol=1e-6, rtol=1e-6)


def test_redundant_heads_eq10_matches_loop():
    g = torch.Generator().manual_seed(1)
    conf, syn = torch.rand(5, 7, generator=g), torch.rand(5, 7, generator=g)
    syn[0, 0] = torch.sigmoid(conf[0, 0])  # the tie: Syn_attn = Syn_gate is redundant (h_label = 0)
    expected = [[not s > 1 / (1 + np.exp(-c)) for c, s in zip(cr, sr)] for cr, sr in zip(conf.tolist(), syn.tolist())]
    got = redundant_heads(conf, syn)
    assert got.dtype == torch.bool and got.tolist() == expected and got[0, 0]


def test_dependency_allowed_eq5_sets_the_diagonal_only():
    dep = torch.zeros(2, 3, 3, dtype=torch.bool)
    dep[0, 0, 2] = dep[0, 2, 0] = True
    got = dependency_allowed(dep)
    expected = [[[i == j or {i, j} == {0, 2} and b == 0 for j in range(3)] for i in range(3)] for b in range(2)]
    assert got.tolist() == expected


def test_dea_mask_eq4_5_values_without_padding():
    _, _, dep, _, _ = setup()
    mask = enhanced_mask(None, torch.zeros(B, T, T), dependency_allowed(dep), None, torch.float32)
    assert mask.shape == (B, 1, T, T)
    low = torch.finfo(torch.float32).min
    for b in range(B):
        for i in range(T):
            for j in range(T):
                assert mask[b, 0, i, j] == (0.0 if dep[b, i, j] or i == j else low)


def numpy_label_bias(emb, weight, bias, proj):
    return np.array([-abs(np.tanh(weight @ w + bias) @ proj) for w in emb])


def lpea_params(dtype=torch.float64, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=dtype) for shape in ((2 * K + 1, D), (D, D), (D,), (D,))]


def test_lpea_eq8_label_bias_and_gather_match_loops():
    _, _, _, rp, _ = setup()
    params = lpea_params()
    labels = lpea_label_bias(*params)
    expected_labels = numpy_label_bias(*(p.numpy() for p in params))
    np.testing.assert_allclose(labels.numpy(), expected_labels, rtol=1e-12)
    assert (labels <= 0).all() and labels.shape == (2 * K + 1,)
    bias, allowed = lpea_bias(rp, labels, NOT_IN_PHRASE)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                value = int(rp[b, i, j])
                inside = value != NOT_IN_PHRASE
                assert allowed[b, i, j] == (inside or i == j)
                if inside:  # M_ij = w_clip(RP_ij, k): positions beyond +-k share the end labels
                    assert bias[b, i, j] == pytest.approx(expected_labels[max(-K, min(K, value)) + K], rel=1e-12)


def test_lpea_bias_gradcheck_float64():
    _, _, _, rp, _ = setup()
    params = [p.requires_grad_() for p in lpea_params()]

    def gathered(*p):
        return lpea_bias(rp, lpea_label_bias(*p), NOT_IN_PHRASE)[0]

    assert torch.autograd.gradcheck(gathered, params)


def test_lpea_bias_gradient_sums_the_upstream_gradient_per_label():
    _, _, _, rp, g = setup()
    labels = lpea_label_bias(*lpea_params()).detach().requires_grad_()
    bias, _ = lpea_bias(rp, labels, NOT_IN_PHRASE)
    upstream = torch.randn(bias.shape, generator=g, dtype=torch.float64)
    bias.backward(upstream)
    index = np.clip(rp.numpy(), -K, K) + K  # every pair has a label, the sentinel clipped to -k
    expected = np.bincount(index.ravel(), weights=upstream.numpy().ravel(), minlength=2 * K + 1)
    np.testing.assert_allclose(labels.grad.numpy(), expected, rtol=1e-12, atol=1e-12)
    for one_hot in (True, False):  # the GPU's way and the CPU's
        summed = sum_per_label(upstream, torch.from_numpy(index), 2 * K + 1, one_hot=one_hot)
        np.testing.assert_allclose(summed.numpy(), expected, rtol=1e-12, atol=1e-12)


def padding_mask(real, dtype=None):
    """What HF gives encoder self-attention: (B, 1, T, T), keys masked (bool, or additive with finfo.min)."""
    allowed = real[:, None, None, :].expand(B, 1, T, T)
    if dtype is None:
        return allowed
    return torch.zeros(B, 1, T, T, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("kind", ["bool", "float", "none"])
def test_enhanced_mask_per_sentence_and_head_matches_loop(kind):
    real, _, _, rp, g = setup()
    if kind == "none":  # HF passes no mask when the batch has no padding
        real = torch.ones_like(real)
    labels = lpea_label_bias(*lpea_params(torch.float32))
    bias, allowed = lpea_bias(rp, labels, NOT_IN_PHRASE)
    selected = torch.rand(B, H, generator=g) < 0.5
    selected[0, 0], selected[0, 1] = True, False
    padding = None if kind == "none" else padding_mask(real, None if kind == "bool" else torch.float32)
    mask = enhanced_mask(padding, bias, allowed, selected, torch.float32)
    assert mask.shape == (B, H, T, T)
    low = torch.finfo(torch.float32).min
    for b in range(B):
        for h in range(H):
            for i in range(T):
                row_keeps = any(allowed[b, i, j] and real[b, j] for j in range(T))
                for j in range(T):
                    if not real[b, j]:
                        expected = low
                    elif not selected[b, h]:
                        expected = 0.0
                    elif not row_keeps:  # a padding row: the padding mask alone
                        expected = 0.0
                    else:
                        expected = float(bias[b, i, j]) if allowed[b, i, j] else low
                    assert float(mask[b, h, i, j]) == pytest.approx(expected), (b, h, i, j)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["dea", "lpea"])
def test_no_attention_row_is_all_masked_with_padding(kind, dtype):
    real, _, dep, rp, g = setup()
    if kind == "dea":
        bias, allowed = torch.zeros(B, T, T), dependency_allowed(dep)
    else:
        bias, allowed = lpea_bias(rp, lpea_label_bias(*lpea_params(torch.float32)), NOT_IN_PHRASE)
    for mask_dtype in (None, dtype):
        mask = enhanced_mask(padding_mask(real, mask_dtype), bias, allowed, torch.ones(B, H, dtype=torch.bool), dtype)
        assert torch.isfinite(mask).all()  # finfo.min, never -inf, never overflowed
        q, k, v = (torch.randn(B, H, T, D, generator=g).to(dtype) for _ in range(3))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.isfinite(out.float()).all()
        probs = (q.float() @ k.float().transpose(-1, -2) + mask.float()).softmax(-1)
        assert torch.isfinite(probs).all()
        assert (probs[~real[:, None, None, :].expand_as(probs)] == 0).all()  # padded keys get exactly zero


def test_rhe_probabilities_and_real_tokens_read_the_padding_mask():
    real, _, _, _, g = setup()
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    for mask in (padding_mask(real), padding_mask(real, torch.float32)):
        allowed = key_allowed(mask, T)
        assert torch.equal(real_tokens(allowed, B, T, "cpu"), real)
        probs = attention_probabilities(q, k, 0.5, allowed, dtype=torch.float32)  # (RHE's Eq. 2, as redundancy has it)
        expected = (q @ k.transpose(-1, -2) * 0.5).masked_fill(~real[:, None, None, :], float("-inf")).softmax(-1)
        torch.testing.assert_close(probs, expected)
    assert key_allowed(None, T) is None and real_tokens(None, B, T, "cpu").all()
