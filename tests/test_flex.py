"""The methods on attn_implementation="flex_attention" (hf_headattn.flex), checked against the SDPA path.

Flex attention runs on the CPU compiled and forward only (torch 2.13 refuses its backward there), so the model
comparisons run without gradients; training on flex is checked on a GPU.
"""

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

import hf_headattn.attention_call
import hf_headattn.methods.sea.core
from conftest import TINY, batch, syntax_batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.flex import dense_mask
from hf_headattn.hf_compat import ALL_ATTENTION_FUNCTIONS

FAMILIES = {"mbart": (HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration),
            "marian": (HeadAttnMarianConfig, HeadAttnMarianMTModel)}
#: The heads SEA treats as redundant, per sentence of :func:`syntax_batch` (B = 2, H = 4): mixed within each.
SELECTED = torch.tensor([[True, False, True, False], [False, True, False, False]])
METHODS = dict(dhicm={"encoder_layers": [-1], "decoder_layers": [-1]},
               eadra={component: {"num_heads": 2} for component in ("encoder", "decoder", "cross")})


@pytest.fixture(autouse=True)
def fresh_compiles():
    """Each test compiles flex attention afresh: once another test in the same process has compiled it for other
    inputs (tests/test_hf_compat.py's, when both run on one worker), the recompiled CPU kernel of torch 2.13 fails to
    build ("'cur_kvSplitSize3' was not declared in this scope"), a torch bug outside this package."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def test_dense_mask_is_the_mask_the_block_mask_stands_for():
    """Padding (per sentence) and causality as a BlockMask (built uncompiled) come back as the bool mask an explicit
    loop gives; other masks pass unchanged; one tensor per block mask within a forward's cache."""
    real = torch.tensor([[True] * 5, [True, True, True, False, False]])  # (B, S)

    def mask_mod(b, h, q, kv):
        return (kv <= q) & real[b, kv]

    block = create_block_mask(mask_mod, B=2, H=None, Q_LEN=5, KV_LEN=5, device="cpu")
    expected = torch.zeros(2, 1, 5, 5, dtype=torch.bool)
    for b in range(2):
        for q in range(5):
            for kv in range(5):
                expected[b, 0, q, kv] = kv <= q and bool(real[b, kv])
    cache = {}
    dense = dense_mask(block, 5, 5, cache)
    assert torch.equal(dense, expected)
    assert dense_mask(block, 5, 5, cache) is dense
    float_mask = torch.zeros(2, 1, 5, 5)
    assert dense_mask(float_mask, 5, 5, cache) is float_mask and dense_mask(None, 5, 5) is None


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dhicm_and_eadra_on_flex_equal_sdpa(family, monkeypatch):
    """The same weights with DHICM and EaDRA on every kind of attention give the SDPA path's logits, loss and terms on
    flex attention (the methods saw BlockMasks), and the same greedy output. (Not beam search: stock HF's beam search
    on CPU flex attention fails in torch 2.13's compiled kernel, "index out of bounds ... cur_qSplitSize".)"""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**TINY, dropout=0.0, attention_dropout=0.0, **METHODS)).eval()
    inputs = batch()
    with torch.no_grad():
        expected = model(**inputs)
        beams = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=4,
                               num_beams=1, do_sample=False)
    masks = []

    def spy(attention_mask, *args):
        masks.append(type(attention_mask))
        return dense_mask(attention_mask, *args)

    monkeypatch.setattr(hf_headattn.attention_call, "dense_mask", spy)
    model.set_attn_implementation("flex_attention")
    with torch.no_grad():
        out = model(**inputs)
        flex_beams = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=4,
                                    num_beams=1, do_sample=False)
    assert masks and set(masks) == {BlockMask}
    for name in ("logits", "loss", "dhicm_kl", "eadra_loss"):
        assert expected[name] is not None, name
        torch.testing.assert_close(out[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
    assert torch.equal(flex_beams, beams)


@pytest.mark.slow
@pytest.mark.parametrize("sea", [{"type": "dea"}, {"type": "lpea", "max_relative_position": 2}])
def test_sea_with_rhe_on_flex_equals_sdpa(sea, monkeypatch):
    """DEA / LPEA on the redundant heads (RHE) as a flex score_mod give the SDPA path's redundant heads, and, with a
    selection that differs between the heads and sentences, its encoder states, logits and loss, with EaDRA on the
    decoder; EaDRA on SEA's own layer (it reads the mask, with SEA's bias in it, as a tensor) too."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0, sea=sea,
                                 eadra={"decoder": {"num_heads": 2}})
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    if sea["type"] == "lpea":  # a bias that differs between labels
        torch.nn.init.normal_(model.model.encoder.layers[0].self_attn.sea.lpea_projection, std=1.0)
    inputs = syntax_batch()
    with torch.no_grad():
        rhe = model(**inputs, output_redundant_heads=True).redundant_heads
        monkeypatch.setattr(hf_headattn.methods.sea.core, "redundant_heads_of", lambda *args: SELECTED)
        expected = model(**inputs)
        model.set_attn_implementation("flex_attention")
        out = model(**inputs)
        monkeypatch.undo()
        flex_rhe = model(**inputs, output_redundant_heads=True).redundant_heads
    assert rhe.keys() == flex_rhe.keys() and all(torch.equal(flex_rhe[name], rhe[name]) for name in rhe)
    for field in ("encoder_last_hidden_state", "logits", "loss", "eadra_loss"):
        torch.testing.assert_close(out[field], expected[field], atol=1e-5, rtol=1e-4, msg=field)
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0, sea=sea,
                                 eadra={"encoder": {"num_heads": 2}})
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    if sea["type"] == "lpea":
        torch.nn.init.normal_(model.model.encoder.layers[0].self_attn.sea.lpea_projection, std=1.0)
    with torch.no_grad():
        expected = model(**inputs)
        model.set_attn_implementation("flex_attention")
        out = model(**inputs)
    for field in ("encoder_last_hidden_state", "logits", "loss", "eadra_loss"):
        torch.testing.assert_close(out[field], expected[field], atol=1e-5, rtol=1e-4, msg=field)


@pytest.fixture
def flex_returns_lse(monkeypatch):
    """transformers' flex attention as it runs on CUDA, on the CPU: its second output the log-sum-exp (B, H, T) of
    each query's scores (``return_lse = query.device.type != "cpu"`` in ``flex_attention_forward``), here computed
    from q, k and the block mask. The list it returns collects what it returned."""
    flex, returned = ALL_ATTENTION_FUNCTIONS["flex_attention"], []

    def with_lse(module, query, key, value, attention_mask, scaling=None, **kwargs):
        output, weights = flex(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        assert weights is None  # (the CPU's)
        scores = query @ key.transpose(-1, -2) * scaling  # (B, H, T, S)
        allowed = dense_mask(attention_mask, query.shape[2], key.shape[2])  # (B, 1, T, S)
        lse = (scores if allowed is None else scores.masked_fill(~allowed, -float("inf"))).logsumexp(-1)  # (B, H, T)
        returned.append(lse)
        return output, lse

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "flex_attention", with_lse)
    return returned


@pytest.mark.slow
@pytest.mark.parametrize("methods", ["off", "dhicm+eadra"])
def test_head_masks_on_flex_leave_its_cuda_log_sum_exp_and_equal_sdpa(methods, flex_returns_lse):
    """With a head mask kept on the model and one per sentence as an argument, flex attention returning the
    log-sum-exp as on CUDA gives the SDPA path's logits and loss (methods off and on), and its (B, H, T) log-sum-exps
    come out as ``output_attentions`` unchanged (the head mask scales weights only)."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**TINY, dropout=0.0, attention_dropout=0.0,
                                 **(METHODS if methods != "off" else {}))
    model = HeadAttnMBartForConditionalGeneration(config).eval()
    model.set_head_mask("encoder", torch.tensor([[1.0, 0.0, 0.5, 1.0], [1.0, 1.0, 1.0, 0.25]]))
    decoder_mask = torch.ones(2, 2, 4)  # (batch, layers, heads)
    decoder_mask[0, 1, 2], decoder_mask[1, 0, 0] = 0.0, 0.5
    inputs = {**batch(), "decoder_head_mask": decoder_mask}
    with torch.no_grad():
        expected = model(**inputs)
        model.set_attn_implementation("flex_attention")
        out = model(**inputs, output_attentions=True)
    attentions = [*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions]
    assert len(flex_returns_lse) == len(attentions) == 6
    assert all(any(a is lse for lse in flex_returns_lse) and a.dim() == 3 for a in attentions)
    for name in ("logits", "loss", *(("dhicm_kl", "eadra_loss") if methods != "off" else ())):
        torch.testing.assert_close(out[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)
