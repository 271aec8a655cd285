"""biased_sdpa (hf_headattn/biased_attention.py): SDPA with a trainable bias, its backward from recomputed
probabilities, against the math by plain autograd in float64 and by gradcheck; a row that allows no key."""

import pytest
import torch

from hf_headattn.biased_attention import biased_sdpa


def reference(query, key, value, bias, allowed, scaling):
    scores = query @ key.mT * scaling + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.nan_to_num(scores.softmax(-1))  # a row that allows no key: no weight (compared elsewhere)
    return probs @ value


@pytest.mark.parametrize("bias_shape", [(2, 3, 4, 5), (2, 1, 4, 5)], ids=str)
def test_values_and_gradients_equal_the_math_and_gradcheck(bias_shape):
    g = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 3, n, 6, generator=g, dtype=torch.float64, requires_grad=True)
                         for n in (4, 5, 5))
    bias = torch.randn(bias_shape, generator=g, dtype=torch.float64, requires_grad=True)
    allowed = torch.rand(2, 1, 4, 5, generator=g) < 0.7
    allowed[:, :, :, 0] = True  # every row allows a key here
    inputs = (query, key, value, bias)
    ours = biased_sdpa(*inputs, allowed, 0.4)
    expected = reference(*inputs, allowed, 0.4)
    torch.testing.assert_close(ours, expected)
    upstream = torch.randn(expected.shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad(ours, inputs, upstream),
                               torch.autograd.grad(expected, inputs, upstream))
    assert torch.autograd.gradcheck(lambda *x: biased_sdpa(*x, allowed, 0.4), inputs)
    assert torch.autograd.gradcheck(lambda *x: biased_sdpa(*x, None, 0.4), inputs)
    # a row that allows no key: SDPA's output and q/k/v gradients (the mean of the values), none to its bias
    allowed[1, 0, 2] = False
    ours = biased_sdpa(*inputs, allowed, 0.4)
    mask = torch.where(allowed, bias.detach(), torch.finfo(bias.dtype).min)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=0.4)
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(ours[1, :, 2], value[1].mean(-2))
    grads = torch.autograd.grad(ours, inputs, upstream)
    torch.testing.assert_close(grads[:3], torch.autograd.grad(expected, inputs[:3], upstream))
    assert grads[3].expand(2, 3, 4, 5)[1, :, 2].abs().sum() == 0 and grads[3].abs().sum() > 0
