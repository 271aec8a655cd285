"""Localness's per-head reading (Yang et al. 2018; ``predictor="head"``) against a float64 loop that reads none of
the package's code, padding included, and float64 gradchecks of every function in W_p, v_p, v_d and the query."""

import math

import pytest
import torch

from hf_headattn.methods.localness.equations import (
    BIAS_FLOOR,
    centre_and_window,
    gaussian_bias,
    localness_logits,
    sentence_positions,
)

B, H, S, D = 3, 2, 6, 4
#: padding on the right (sentence 1), on the left (sentence 2), none (sentence 0)
REAL = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [False] + [True] * 5])


def parameters(seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    weight, centre_vector, window_vector = (torch.randn(*shape, generator=g, dtype=torch.float64)
                                            for shape in ((D, D), (D,), (D,)))
    return query, weight, centre_vector, window_vector


def loop_bias(query, weight, centre_vector, window_vector, real, window=None):
    """G[b, h, i, j] by the paper's equations, one scalar at a time, over the real tokens' positions (0 at padding
    keys)."""
    B, H, S, D = query.shape
    bias = torch.zeros(B, H, S, S, dtype=torch.float64)
    for b in range(B):
        reals = [s for s in range(S) if real[b, s]]
        length = len(reals)
        for h in range(H):
            for i in range(S):
                hidden = [math.tanh(sum(weight[r, c].item() * query[b, h, i, c].item() for c in range(D)))
                          for r in range(D)]
                p = sum(centre_vector[r].item() * hidden[r] for r in range(D))
                centre = length / (1 + math.exp(-p))
                if window is None:
                    z = sum(window_vector[r].item() * hidden[r] for r in range(D))
                    width = length / (1 + math.exp(-z))
                else:
                    width = window
                sigma = width / 2
                for j in range(S):
                    if not real[b, j]:
                        continue  # padding keys: masked by the call's mask, their bias is not checked
                    position = reals.index(j)
                    bias[b, h, i, j] = -((position - centre) ** 2) / (2 * sigma ** 2)
    return bias


@pytest.mark.parametrize("window", [None, 3])
def test_bias_against_a_float64_loop_with_padding(window):
    query, weight, centre_vector, window_vector = parameters()
    positions, lengths = sentence_positions(REAL)
    assert lengths.tolist() == [6, 4, 5]
    assert positions[2, 1:].tolist() == [0, 1, 2, 3, 4] and positions[1, :4].tolist() == [0, 1, 2, 3]
    centre, width = centre_and_window(query, weight, centre_vector, None if window else window_vector,
                                      lengths.double(), window)
    bias = gaussian_bias(centre, width, positions)
    assert bias.shape == (B, H, S, S) and torch.isfinite(bias).all()
    expected = loop_bias(query, weight, centre_vector, window_vector, REAL, window)
    keys = REAL[:, None, None, :].expand_as(bias)
    torch.testing.assert_close(bias[keys], expected[keys], rtol=1e-12, atol=1e-12)
    assert (centre > 0).all() and (centre < lengths[:, None, None]).all()


def test_a_collapsed_window_stays_finite():
    centre, positions = torch.tensor([[[0.5]]]), torch.arange(1000.0)[None]
    bias = gaussian_bias(centre, torch.zeros(1, 1, 1), positions)
    assert torch.isfinite(bias).all() and bias.max() < -1e5  # float32 (and bfloat16's range)
    floored = gaussian_bias(centre, torch.zeros(1, 1, 1), positions, BIAS_FLOOR)
    assert torch.isfinite(floored.half()).all() and floored.min() == BIAS_FLOOR


def test_gradcheck_in_every_input():
    query, weight, centre_vector, window_vector = parameters(1)
    query = query[:, :, :3]  # a few queries keep the check quick
    positions, lengths = sentence_positions(REAL)
    lengths = lengths.double()
    for tensor in (query, weight, centre_vector, window_vector):
        tensor.requires_grad_(True)

    def predicted(q, w, vp, vd):
        return gaussian_bias(*centre_and_window(q, w, vp, vd, lengths), positions.double())

    def fixed(q, w, vp):
        return gaussian_bias(*centre_and_window(q, w, vp, None, lengths, 2.0), positions.double())

    assert torch.autograd.gradcheck(predicted, (query, weight, centre_vector, window_vector))
    assert torch.autograd.gradcheck(fixed, (query, weight, centre_vector))
    assert torch.autograd.gradcheck(lambda q, w: localness_logits(q, w, torch.stack([centre_vector, window_vector],
                                                                                    -1).detach()), (query, weight))


def test_the_gaussian_bias_function_equals_autograd_through_its_formula():
    """GaussianBias (r and the bias saved, the backward's sums products over the keys): the values and gradients of
    -((j - P) c)^2 by plain autograd, float64, and its gradcheck (P, c and the upstream gradient random); with an
    additive mask in the same write."""
    from hf_headattn.methods.localness.equations import GaussianBias

    g = torch.Generator().manual_seed(3)
    centre = (torch.rand(2, 3, 5, generator=g, dtype=torch.float64) * 6).requires_grad_()
    inverse = (torch.rand(2, 3, 5, generator=g, dtype=torch.float64) + 0.2).requires_grad_()
    positions = torch.tensor([[0.0, 1, 2, 3, 4, 5, 6], [-1.0, 0, 1, 2, 3, 3, 3]], dtype=torch.float64)
    upstream = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    by_formula = -((positions[:, None, None, :] - centre[..., None]) * inverse[..., None]) ** 2
    expected = torch.autograd.grad(by_formula, (centre, inverse), upstream)
    bias = GaussianBias.apply(centre, inverse, positions)
    torch.testing.assert_close(bias, by_formula)
    for got, want in zip(torch.autograd.grad(bias, (centre, inverse), upstream), expected):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(lambda p, c: GaussianBias.apply(p, c, positions), (centre, inverse))
    # with the call's mask in the same write (finfo.min where masked, whose entries get no gradient downstream)
    allowed = torch.rand(2, 1, 5, 7, generator=g) < 0.7
    base = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    masked = GaussianBias.apply(centre, inverse, positions, base)
    torch.testing.assert_close(masked, torch.where(allowed, by_formula, torch.finfo(torch.float64).min))
    kept = upstream * allowed
    by_formula = -((positions[:, None, None, :] - centre[..., None]) * inverse[..., None]) ** 2
    for got, want in zip(torch.autograd.grad(masked, (centre, inverse), kept),
                         torch.autograd.grad(by_formula, (centre, inverse), kept)):
        torch.testing.assert_close(got, want)
