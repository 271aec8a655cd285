"""With every method off, our models are the stock HF models: same logits, loss and generated tokens."""

import pytest
import torch

from conftest import FAMILIES, batch


def load_pair(family, path, attn_implementation):
    _, stock_cls, ours_cls = FAMILIES[family]
    stock = stock_cls.from_pretrained(path, attn_implementation=attn_implementation).eval()
    ours = ours_cls.from_pretrained(path, attn_implementation=attn_implementation).eval()
    return stock, ours


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("padded", [True, False])
def test_logits_and_loss_equal_stock(stock_checkpoint, attn_implementation, padded):
    family, path = stock_checkpoint
    stock, ours = load_pair(family, path, attn_implementation)
    inputs = batch()
    if not padded:
        inputs = {k: v[:1] for k, v in inputs.items()}
    with torch.no_grad():
        expected, got = stock(**inputs), ours(**inputs)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.nll_loss, expected.loss, atol=1e-5, rtol=0)
    assert got.dhicm_kl is None and got.eadra_loss is None and got.head_importances is None


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_equals_stock(stock_checkpoint, attn_implementation, num_beams):
    family, path = stock_checkpoint
    stock, ours = load_pair(family, path, attn_implementation)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    settings = dict(num_beams=num_beams, max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert torch.equal(ours.generate(**inputs, **settings), stock.generate(**inputs, **settings))


def test_gradients_equal_stock(stock_checkpoint):
    family, path = stock_checkpoint
    stock, ours = load_pair(family, path, "sdpa")
    stock.train(), ours.train()
    torch.manual_seed(1)
    stock(**batch()).loss.backward()
    torch.manual_seed(1)
    ours(**batch()).loss.backward()
    stock_grads = dict(stock.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, stock_grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)


def test_no_missing_or_unexpected_weights(stock_checkpoint):
    family, path = stock_checkpoint
    _, _, ours_cls = FAMILIES[family]
    _, info = ours_cls.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_return_dict_false_gives_tuple(stock_checkpoint):
    family, path = stock_checkpoint
    _, ours = load_pair(family, path, "sdpa")
    with torch.no_grad():
        as_tuple = ours(**batch(), return_dict=False)
        as_output = ours(**batch())
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], as_output.loss)
