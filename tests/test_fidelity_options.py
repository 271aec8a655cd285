"""The readings of the papers' open choices, each checked against a hand computation: DHICM's KL
reduction and collapse statistics; EaDRA's distance and peak reductions, alpha warm-up and explicit heads."""

import math

import numpy as np
import pytest
import torch
from test_eadra_math import case, eadra_regularizers

from conftest import TINY, batch
from hf_headattn import HeadAttnMarianConfig, HeadAttnMarianMTModel
from hf_headattn.methods.dhicm import core as dhicm
from hf_headattn.methods.eadra import core as eadra


def collapse_statistics(importance: torch.Tensor,
                        mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The test's reference for ``dhicm_stats``: how close the importances are to one-hot: (mean normalised entropy,
    share of tokens with a top head > 0.9).

    importance (B, T, H) rows of G (Eq. 1); mask (B, T) bool, the real tokens (None: all). The normalised entropy
    H(G) / ln H is 1 for uniform and 0 for one-hot importances. Both are means over the real tokens, detached.
    """
    g = importance.detach().float()
    entropy = -(g * g.clamp_min(torch.finfo(g.dtype).tiny).log()).sum(-1) / math.log(g.shape[-1])  # (B, T)
    top = g.amax(-1) > dhicm.TOP_HEAD_THRESHOLD
    weights = dhicm.token_weights(mask)
    return dhicm.token_mean(entropy, weights), dhicm.token_mean(top, weights)

NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0)


def dhicm_on(**dhicm):
    """Config fields with DHICM in the last layers, no dropout, and ``dhicm`` (its settings)."""
    return dict(NO_DROPOUT, dhicm={"encoder_layers": [-1], "decoder_layers": [-1], "dropout": 0.0, **dhicm})


def model(seed=0, **settings):
    torch.manual_seed(seed)
    return HeadAttnMarianMTModel(HeadAttnMarianConfig(**TINY, **settings))


# --- DHICM ------------------------------------------------------------------------------------------------------


def test_kl_reductions_by_hand():
    kl = torch.tensor(0.7)
    assert dhicm.kl_objective_term(kl, 0.1, "per_token", 50).item() == pytest.approx(-0.07)
    assert dhicm.kl_objective_term(kl, 0.1, "per_batch", 50).item() == pytest.approx(-0.0014)
    with pytest.raises(ValueError, match="per_sentence"):
        dhicm.kl_objective_term(kl, 0.1, "per_sentence", 50)


@pytest.mark.parametrize("reduction", ["per_token", "per_batch"])
def test_model_loss_uses_the_kl_reduction(reduction):
    net = model(**dhicm_on(kl_weight=0.3, kl_reduction=reduction)).eval()
    with torch.no_grad():
        out = net(**batch())
    tokens = int(batch()["labels"].ne(-100).sum())  # 6 real target tokens
    weight = 0.3 if reduction == "per_token" else 0.3 / tokens
    assert out.dhicm_kl > 0
    torch.testing.assert_close(out.loss, out.nll_loss - weight * out.dhicm_kl)


def test_per_batch_with_gradient_accumulation_sums_the_kls_over_all_tokens():
    """Two micro-batches, num_items_in_batch = all tokens: the term is -lambda (KL_1 + KL_2) / N_all (fairseq)."""
    net = model(**dhicm_on(kl_weight=0.5, kl_reduction="per_batch")).eval()
    full = batch()
    halves = [{key: value[i:i + 1] for key, value in full.items()} for i in (0, 1)]
    n_all = full["labels"].ne(-100).sum()
    with torch.no_grad():
        outs = [net(**half, num_items_in_batch=n_all) for half in halves]
        nll_sum = sum(out.nll_loss * half["labels"].ne(-100).sum() for out, half in zip(outs, halves))
    expected = (nll_sum - 0.5 * (outs[0].dhicm_kl + outs[1].dhicm_kl)) / n_all
    torch.testing.assert_close(outs[0].loss + outs[1].loss, expected)


def test_collapse_statistics_by_hand():
    g = torch.tensor([[[0.25, 0.25, 0.25, 0.25], [0.97, 0.01, 0.01, 0.01], [0.5, 0.5, 0.0, 0.0]]])  # (1, 3, 4)
    mask = torch.tensor([[True, True, False]])

    def entropy(row):
        return -sum(p * math.log(p) for p in row if p > 0) / math.log(4)

    got_entropy, got_top = collapse_statistics(g, mask)
    assert got_entropy.item() == pytest.approx((entropy(g[0, 0].tolist()) + entropy(g[0, 1].tolist())) / 2)
    assert got_top.item() == pytest.approx(0.5)  # one of the two real tokens has a head above 0.9
    all_entropy, all_top = collapse_statistics(g)
    assert all_entropy.item() == pytest.approx(sum(entropy(r) for r in g[0].tolist()) / 3)
    assert all_top.item() == pytest.approx(1 / 3)


def test_model_reports_collapse_statistics_averaged_over_modules():
    net = model(**dhicm_on()).eval()
    with torch.no_grad():
        out = net(**batch(), output_head_importance=True)
    masks = {"encoder": batch()["attention_mask"].bool(), "decoder": batch()["labels"].ne(-100)}
    per_module = [collapse_statistics(g, masks[name.split(".")[0]]) for name, g in out.head_importances.items()]
    assert len(per_module) == 3  # last encoder self, last decoder self and cross
    for i, key in enumerate(("importance_entropy", "top_head_share")):
        expected = sum(stats[i] for stats in per_module) / len(per_module)
        torch.testing.assert_close(out.dhicm_stats[key], expected)
        assert not out.dhicm_stats[key].requires_grad
    assert 0.9 < out.dhicm_stats["importance_entropy"] <= 1.0  # near uniform at initialisation


def test_collapsed_importances_give_a_top_head_share_of_one():
    net = model(**dhicm_on()).eval()
    for module in net.modules():
        if isinstance(module, dhicm.DHICM):
            module.u.data.mul_(1e4), module.w.data.mul_(1e4)  # huge scores: one-hot importances
    with torch.no_grad():
        out = net(**batch())
    assert out.dhicm_stats["top_head_share"].item() == 1.0
    assert out.dhicm_stats["importance_entropy"].item() < 0.05


def test_bad_kl_reduction_is_refused():
    with pytest.raises(ValueError, match="dhicm.kl_reduction.*'mean'"):
        HeadAttnMarianConfig(**TINY, **dhicm_on(kl_reduction="mean"))


# --- EaDRA: reductions --------------------------------------------------------------------------------------------


def hand_terms(a, support, queries, dist_reduction, peak_reduction):
    """(B, H, 3) R_peak, R_sent, R_dist with loops and an explicit D, under the given reading."""
    a, support, queries = a.numpy(), support.numpy(), queries.numpy()
    B, H, T, S = a.shape
    out = np.zeros((B, H, 3))

    def h_n(p, keys):
        return 0.0 if len(keys) <= 1 else -sum(p[j] * math.log(p[j]) for j in keys if p[j] > 0) / math.log(len(keys))

    for b in range(B):
        real = [i for i in range(T) if queries[b, i]]
        keys = sorted({j for i in real for j in range(S) if support[b, i, j]})
        scale = 1.0 / max(len(keys) - 1, 1) if dist_reduction == "normalized_positions" else 1.0
        D = np.array([[abs(s - t) * scale for t in range(S)] for s in range(S)])
        pairs = [i for i in range(T - 1) if queries[b, i] and queries[b, i + 1]]
        for h in range(H):
            entropies = [h_n(a[b, h, i], [j for j in range(S) if support[b, i, j]]) for i in real]
            out[b, h, 0] = sum(entropies) / (1 if peak_reduction == "sum" else max(len(real), 1))
            a_bar = sum(a[b, h, i] for i in real) / max(len(real), 1)
            out[b, h, 1] = -h_n(a_bar, keys)
            dist = sum(a[b, h, i] @ D @ a[b, h, i + 1] for i in pairs)
            out[b, h, 2] = dist / max(len(pairs), 1) if dist_reduction == "pair_mean" else dist
    return torch.from_numpy(out)


@pytest.mark.parametrize("kind", ["encoder", "cross", "causal"])
@pytest.mark.parametrize("dist_reduction", ["sum", "pair_mean", "normalized_positions"])
@pytest.mark.parametrize("peak_reduction", ["mean", "sum"])
def test_rescaled_terms_equal_a_hand_computation(kind, dist_reduction, peak_reduction):
    scores, support, queries, a = case(kind)  # support (B, T, S), queries (B, T), a (B, H, T, S)
    support4, queries4 = support[:, None], queries[:, None]
    terms = eadra.rescale_terms(eadra_regularizers(scores, support4, queries4), support4, queries4,
                                dist_reduction, peak_reduction)
    expected = hand_terms(a, support, queries, dist_reduction, peak_reduction)
    for i in range(3):
        torch.testing.assert_close(terms[i], expected[..., i], rtol=1e-9, atol=1e-10)


def test_bad_reduction_names_are_refused():
    scores, support, queries, _ = case("encoder")
    terms = eadra_regularizers(scores, support[:, None], queries[:, None])
    with pytest.raises(ValueError, match="dist_reduction"):
        eadra.rescale_terms(terms, support[:, None], queries[:, None], dist_reduction="mean")
    with pytest.raises(ValueError, match="peak_reduction"):
        eadra.rescale_terms(terms, support[:, None], queries[:, None], peak_reduction="max")


def eadra_model(seed=0, **options):
    settings = {"encoder": {"alpha_peak": 0.5}, "decoder": {"alpha_peak": 0.5}, **options}
    return model(seed, dropout=0.0, attention_dropout=0.0, eadra=settings)


def test_model_terms_under_each_reading_of_one_unpadded_sentence():
    """One sentence without padding: pair_mean = sum / (n - 1), peak sum = mean * n, per component."""
    one = {key: value[:1] for key, value in batch().items()}  # 6 source, 4 target tokens
    with torch.no_grad():
        literal = eadra_model(dist_reduction="sum", peak_reduction="mean").eval()(**one).eadra_terms
        other = eadra_model(dist_reduction="pair_mean", peak_reduction="sum").eval()(**one).eadra_terms
    for component, n in (("encoder", 6), ("decoder", 4)):
        torch.testing.assert_close(other[f"{component}/dist"], literal[f"{component}/dist"] / (n - 1))
        torch.testing.assert_close(other[f"{component}/peak"], literal[f"{component}/peak"] * n)
        torch.testing.assert_close(other[f"{component}/sent"], literal[f"{component}/sent"])


def test_alpha_scale_multiplies_every_alpha_and_defaults_to_the_study_choice():
    with torch.no_grad():
        full = eadra_model(alpha_scale=1.0).eval()(**batch())
        scaled = eadra_model(alpha_scale=0.25).eval()(**batch())
        default = eadra_model().eval()(**batch())
    torch.testing.assert_close(scaled.eadra_loss, 0.25 * full.eadra_loss)
    torch.testing.assert_close(default.eadra_loss, eadra.ALPHA_SCALE * full.eadra_loss)
    for name, value in full.eadra_terms.items():  # the logged terms are unweighted
        torch.testing.assert_close(scaled.eadra_terms[name], value)
    with pytest.raises(ValueError, match=r"eadra.alpha_scale must be a number in \[0.0, inf\), got -1"):
        eadra_model(alpha_scale=-1.0)


# --- EaDRA: warm-up -----------------------------------------------------------------------------------------------


def test_warmup_scales_the_alphas_by_step_over_warmup_steps_and_counts_training_forwards_only():
    net, plain = eadra_model(warmup_steps=4), eadra_model()
    plain.load_state_dict(net.state_dict(), strict=False)
    net.train(), plain.train()
    factors = []
    for _ in range(6):
        torch.manual_seed(1)
        out = net(**batch())
        torch.manual_seed(1)
        full = plain(**batch()).eadra_loss
        factors.append((out.eadra_loss / full).item())
        assert out.eadra_terms["warmup"].item() == pytest.approx(factors[-1], abs=1e-6)
    assert factors == pytest.approx([0, 0.25, 0.5, 0.75, 1, 1], abs=1e-6)
    net.eval()
    with torch.no_grad():
        net(**batch())  # evaluation does not advance the count
    steps = {buf.item() for name, buf in net.named_buffers() if name.endswith("eadra.step")}
    assert steps == {6}


def test_warmup_step_survives_save_and_load(tmp_path):
    net = eadra_model(warmup_steps=10).train()
    for _ in range(3):
        net(**batch())
    net.save_pretrained(tmp_path)
    loaded = HeadAttnMarianMTModel.from_pretrained(tmp_path)
    steps = [buf.item() for name, buf in loaded.named_buffers() if name.endswith("eadra.step")]
    assert steps and set(steps) == {3}
    fresh = eadra_model(warmup_steps=10)
    assert {buf.item() for name, buf in fresh.named_buffers() if name.endswith("eadra.step")} == {0}
    assert not any(name.endswith("eadra.step") for name, _ in eadra_model().named_buffers())  # no warm-up: no buffer


# --- EaDRA: heads and settings --------------------------------------------------------------------------------


def test_explicit_heads_regularize_those_heads():
    """heads=[1, 3] gives the terms of heads 1 and 3, from the eager attention maps by the hand computation."""
    net = model(dropout=0.0, attention_dropout=0.0, eadra={"encoder": {"heads": [3, 1], "layers": [0]},
                                                               "dist_reduction": "sum"}).eval()
    net.set_attn_implementation("eager")
    inputs = batch()
    with torch.no_grad():
        out = net(**inputs, output_attentions=True)
    source = inputs["attention_mask"].bool()
    support = source[:, None, :].expand(-1, 6, 6)
    maps = out.encoder_attentions[0][:, [1, 3]].double()
    expected = hand_terms(maps, support, source, "sum", "mean").sum((0, 1)) / inputs["labels"].ne(-100).sum()
    for i, name in enumerate(("peak", "sent", "dist")):
        assert out.eadra_terms[f"encoder/{name}"].item() == pytest.approx(expected[i].item(), rel=1e-5, abs=1e-6)
    assert net.headattn_settings["eadra"].components["encoder"].heads == [1, 3]


@pytest.mark.parametrize("settings, message", [
    ({"encoder": {"heads": [4]}}, "heads"),
    ({"encoder": {"heads": []}}, "heads"),
    ({"encoder": {"heads": [0, 1], "num_heads": 3}}, "num_heads"),
    ({"encoder": {}, "dist_reduction": "mean"}, "dist_reduction"),
    ({"encoder": {}, "peak_reduction": "max"}, "peak_reduction"),
    ({"encoder": {}, "warmup_steps": -1}, "warmup_steps"),
    ({"encoder": {}, "warmup_steps": 2.5}, "warmup_steps"),
    ({"encoder": {}, "warm_up": 3}, "warm_up"),
    ({"warmup_steps": 3}, "must map some of"),
])
def test_bad_eadra_options_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        HeadAttnMarianConfig(**TINY, eadra=settings)
