"""DHICM (Goindani & Shrivastava 2021): Eq. 1-4 against numpy, gradients, the attached module, loss, generation."""

import math

import numpy as np
import pytest
import torch

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
)
from hf_headattn.methods.dhicm.core import (
    attend_over_heads,
    combine_heads,
    dropout,
    importance_scores,
    importance_softmax,
)

DHICM = {"encoder_layers": [-1], "decoder_layers": [-1]}
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0)


def kl_from_uniform(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 4: KL(a || b) = sum_h a_h ln(a_h / b_h) with a = softmax(scores), b uniform over the H heads.

    Computed from log-softmax (= ln H - entropy(a)), so one-hot importances give ln H without NaN. (..., H) -> (...).
    """
    log_a = torch.log_softmax(scores, dim=-1)
    return (log_a.exp() * (log_a + math.log(scores.shape[-1]))).sum(-1)


def numpy_dhicm(O, x, W, U, V):
    """Eq. 1-4 with explicit loops over tokens and heads."""
    B, T, H, _ = O.shape
    d_m = W.shape[0]
    G, out, kl = np.zeros((B, T, H)), np.zeros((B, T, d_m)), np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            s = np.array([O[b, t, h] @ W.T @ U @ x[b, t] / math.sqrt(d_m) for h in range(H)])
            g = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            G[b, t] = g
            out[b, t] = sum(g[h] * V @ O[b, t, h] for h in range(H))
            kl[b, t] = sum(g[h] * np.log(g[h] / (1 / H)) for h in range(H))
    return G, out, kl


def random_inputs(dtype=torch.float64, B=2, T=3, H=4, d_k=5, d=8, d_m=6):
    g = torch.Generator().manual_seed(0)
    O = torch.randn(B, T, H, d_k, generator=g, dtype=dtype)
    x = torch.randn(B, T, d, generator=g, dtype=dtype)
    W, U, V = (torch.randn(d_m, n, generator=g, dtype=dtype) for n in (d_k, d, d_k))
    return O, x, W, U, V


def test_equations_1_to_4_match_numpy():
    O, x, W, U, V = random_inputs()
    scores = importance_scores(O, x @ U.T, W)
    G = importance_softmax(scores)
    ref_G, ref_out, ref_kl = numpy_dhicm(*(t.numpy() for t in (O, x, W, U, V)))
    np.testing.assert_allclose(G.numpy(), ref_G, rtol=1e-10)
    np.testing.assert_allclose(combine_heads(O, G, V).numpy(), ref_out, rtol=1e-10)
    np.testing.assert_allclose(kl_from_uniform(scores).numpy(), ref_kl, rtol=1e-8, atol=1e-12)


def test_fused_attention_over_heads_matches_numpy_and_its_gradients_check():
    """The path without G (no loss, no read-out: generate) is Eq. 1-3 as one SDPA call over the heads."""
    O, x, W, U, V = random_inputs()
    _, ref_out, _ = numpy_dhicm(*(t.numpy() for t in (O, x, W, U, V)))
    np.testing.assert_allclose(attend_over_heads(O, x @ U.T @ W, V).numpy(), ref_out, rtol=1e-10)
    O, x, W, U, V = (t.requires_grad_() for t in random_inputs(B=1, T=2, H=3, d_k=2, d=3, d_m=2))
    assert torch.autograd.gradcheck(lambda O, x, W, U, V: attend_over_heads(O, x @ U.T @ W, V), (O, x, W, U, V))


def test_gradcheck_float64():
    O, x, W, U, V = (t.requires_grad_() for t in random_inputs(B=1, T=2, H=3, d_k=2, d=3, d_m=2))

    def f(O, x, W, U, V):
        scores = importance_scores(O, x @ U.T, W)
        return combine_heads(O, importance_softmax(scores), V).sum() + kl_from_uniform(scores).sum()

    assert torch.autograd.gradcheck(f, (O, x, W, U, V))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_keeps_1_minus_p_scaled_by_its_inverse_and_passes_gradients_through_the_kept(dtype):
    """DHICM's dropout of Ux (Eq. 2) draws its CPU mask from 16-bit lanes of random integers: the distribution of
    F.dropout with p rounded to a multiple of 2^-16, the kept values scaled by the inverse of the rounded keep rate."""
    torch.manual_seed(0)
    x = torch.rand(401, 250, dtype=dtype) + 1  # 100250 entries: not a multiple of the 4 lanes per draw
    x.requires_grad_()
    p = 0.2
    keep_rate = 1 - round(p * 2**16) / 2**16  # 0.8000030...
    out = dropout(x, p, training=True)
    kept = out != 0
    assert out.dtype == dtype
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005  # 100k draws: sd 0.0013
    per_lane = kept.flatten()[:100248].view(-1, 4).float().mean(0)  # each of the 4 lanes of a draw: sd 0.0025
    torch.testing.assert_close(per_lane, torch.full((4,), 1 - p), atol=0.01, rtol=0)
    torch.testing.assert_close(out[kept], (x[kept].float() / keep_rate).to(dtype))
    out.sum().backward()
    torch.testing.assert_close(x.grad, (kept.float() / keep_rate).to(dtype))
    assert dropout(x, p, training=False) is x
    assert torch.equal(dropout(x, 0.0, training=True), x)
    torch.manual_seed(0)  # a last dimension divisible by 4 draws the lanes in x's shape: the same law per lane
    kept = dropout(torch.ones(250, 400, dtype=dtype), p, training=True) != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    torch.testing.assert_close(kept.view(-1, 4).float().mean(0), torch.full((4,), 1 - p), atol=0.01, rtol=0)


def test_kl_bounds_and_extremes():
    H = 4
    assert kl_from_uniform(torch.zeros(H)).item() == pytest.approx(0.0, abs=1e-7)
    one_hot = kl_from_uniform(torch.tensor([1e4, 0.0, 0.0, 0.0]))
    assert torch.isfinite(one_hot) and one_hot.item() == pytest.approx(math.log(H), rel=1e-6)
    kl = kl_from_uniform(torch.randn(100, H) * 3)
    assert (kl >= -1e-7).all() and (kl <= math.log(H) + 1e-6).all()


def tiny(family="mbart", **dhicm):
    """A tiny model with DHICM in the last encoder and decoder layers, updated with ``dhicm`` (its settings)."""
    torch.manual_seed(0)
    cls, cfg = {"mbart": (HeadAttnMBartForConditionalGeneration, HeadAttnMBartConfig),
                "marian": (HeadAttnMarianMTModel, HeadAttnMarianConfig)}[family]
    return cls(cfg(**TINY, **NO_DROPOUT, dhicm={**DHICM, **dhicm})).eval()


def test_module_output_is_equation_3_with_out_proj_as_w_s():
    model = tiny()
    attn = model.model.encoder.layers[-1].self_attn
    x = torch.randn(2, 5, 16)
    B, T, H, D = 2, 5, 4, 4
    q, k, v = (proj(x).view(B, T, H, D).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    O = (torch.softmax(q @ k.transpose(-1, -2) * D**-0.5, -1) @ v).transpose(1, 2)  # (B, T, H, D)
    d = attn.dhicm
    G = importance_softmax(importance_scores(O, x @ d.u.T, d.w))
    expected = attn.out_proj(combine_heads(O, G, d.v))
    got, _ = attn(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_logits_without_a_loss_equal_those_with_one():
    """Without labels under no_grad DHICM takes the fused path (no G); the logits are those of the path with G."""
    model = tiny()
    inputs = batch()
    with torch.no_grad():
        with_loss = model(**inputs)
        without = model(**{k: v for k, v in inputs.items() if k != "labels"},
                        decoder_input_ids=model._shift_labels(inputs["labels"]))
    assert with_loss.dhicm_kl is not None and without.dhicm_kl is None
    torch.testing.assert_close(without.logits, with_loss.logits, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("family", ["mbart", "marian"])
def test_loss_is_nll_minus_lambda_kl_and_sdpa_equals_eager(family):
    model = tiny(family, kl_weight=0.3, kl_reduction="per_token")
    with torch.no_grad():
        sdpa = model(**batch())
        model.set_attn_implementation("eager")
        eager = model(**batch())
    assert sdpa.dhicm_kl > 0
    torch.testing.assert_close(sdpa.loss, sdpa.nll_loss - 0.3 * sdpa.dhicm_kl)
    torch.testing.assert_close(eager.logits, sdpa.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(eager.dhicm_kl, sdpa.dhicm_kl, atol=1e-7, rtol=1e-4)


def sharp(model):
    """The model with DHICM parameters far from their initialisation (peaked G, gradients of every parameter)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".dhicm." in name:
                parameter.copy_(torch.randn(parameter.shape, generator=g))
    return model.train()


@pytest.mark.parametrize("mode", ["paper", "scaled_out_proj"])
def test_autocast_and_bf16_weights_match_float32(mode):
    """Under autocast (bf16 attention, float32 DHICM parameters) and with bf16 weights, G and the KL are float32 and
    loss, KL and the DHICM parameters' gradients match the float32 model's."""
    reference = sharp(tiny(mode=mode))
    out = reference(**batch())
    out.loss.backward()
    mixed = sharp(tiny(mode=mode))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = mixed(**batch())
    got.loss.backward()
    weights = sharp(tiny(mode=mode)).to(torch.bfloat16)
    half = weights(**batch())
    half.loss.backward()
    assert out.dhicm_kl > 0.03 and got.dhicm_kl.dtype == half.dhicm_kl.dtype == torch.float32
    for run in (got, half):
        torch.testing.assert_close(run.loss.float(), out.loss, atol=0.02, rtol=0.01)
        torch.testing.assert_close(run.dhicm_kl, out.dhicm_kl, atol=0.03, rtol=0.03)
    for name, parameter in reference.named_parameters():
        if ".dhicm." in name:
            expected = parameter.grad
            assert expected.abs().max() > 1e-7, name
            for model in (mixed, weights):
                grad = model.get_parameter(name).grad
                assert grad.dtype == model.get_parameter(name).dtype
                torch.testing.assert_close(grad.float(), expected, atol=0.05 * expected.abs().max().item(), rtol=0.1)


def test_kl_averages_over_real_tokens_and_modules():
    model = tiny(decoder_layers=None)
    out = model(**batch(), output_head_importance=True)
    G = out.head_importances["encoder.layers.1.self_attn"]  # (B, S, H), padding zeroed
    mask = batch()["attention_mask"].bool()
    assert G.shape == (2, 6, 4) and (G[~mask] == 0).all()
    torch.testing.assert_close(G[mask].sum(-1), torch.ones(int(mask.sum())))
    expected = (G[mask] * (G[mask] * 4).log()).sum(-1).mean()
    torch.testing.assert_close(out.dhicm_kl, expected, atol=1e-6, rtol=1e-4)


def test_readout_names_tell_side_layer_and_kind():
    out = tiny()(**batch(), output_head_importance=True)
    assert set(out.head_importances) == {
        "encoder.layers.1.self_attn", "decoder.layers.1.self_attn", "decoder.layers.1.encoder_attn"
    }
    assert out.head_importances["decoder.layers.1.encoder_attn"].shape == (2, 4, 4)
    cross_only = tiny(decoder_layers=None, cross_layers=[-1])
    assert cross_only(**batch(), output_head_importance=True).head_importances.keys() == {
        "encoder.layers.1.self_attn", "decoder.layers.1.encoder_attn"
    }


def test_gradients_reach_the_dhicm_parameters():
    model = tiny().train()
    model(**batch()).loss.backward()
    for name, param in model.named_parameters():
        if ".dhicm." in name:
            assert param.grad is not None and param.grad.abs().sum() > 0, name


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_with_cache_equals_full_recompute(num_beams):
    model = tiny()
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    settings = dict(num_beams=num_beams, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    cached = model.generate(**inputs, **settings, use_cache=True)
    assert torch.equal(cached, model.generate(**inputs, **settings, use_cache=False))


def test_save_load_round_trip_keeps_parameters_and_settings(tmp_path):
    model = tiny(dim=8, kl_weight=0.2, mode="paper")
    model.save_pretrained(tmp_path)
    loaded = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert (loaded.config.dhicm["dim"], loaded.config.dhicm["kl_weight"]) == (8, 0.2)
    assert loaded.model.encoder.layers[-1].self_attn.out_proj.weight.shape == (16, 8)  # W_s: d_m -> d
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch()).logits, model(**batch()).logits)


def test_stock_checkpoint_loads_with_dhicm_on(stock_checkpoint):
    family, path = stock_checkpoint
    cls = {"mbart": HeadAttnMBartForConditionalGeneration, "marian": HeadAttnMarianMTModel}[family]
    model, info = cls.from_pretrained(path, **NO_DROPOUT, dhicm=DHICM, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    assert info["missing_keys"] and all(".dhicm." in key for key in info["missing_keys"])
    assert all(torch.isfinite(p).all() and p.abs().sum() > 0 for n, p in model.named_parameters() if ".dhicm." in n)


def test_scaled_out_proj_mode_starts_as_the_pretrained_model(stock_checkpoint):
    family, path = stock_checkpoint
    from conftest import FAMILIES

    _, stock_cls, ours_cls = FAMILIES[family]
    stock = stock_cls.from_pretrained(path).eval()
    ours = ours_cls.from_pretrained(path, **NO_DROPOUT, dhicm={**DHICM, "mode": "scaled_out_proj"}).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch()).logits, stock(**batch()).logits, atol=1e-5, rtol=0)
    ours.train()
    ours(**batch()).loss.backward()
    u_grad = ours.model.encoder.layers[-1].self_attn.dhicm.u.grad
    assert u_grad is not None and u_grad.abs().sum() > 0  # it can move away from uniform


def test_mean_head_importance_over_batches_and_heatmap(tmp_path, monkeypatch):
    from hf_headattn.experiment.analysis import mean_head_importance, plot_head_importance
    from hf_headattn.methods.dhicm import analysis

    model = tiny()
    means = mean_head_importance(model, [batch(), batch()])
    out = model(**batch(), output_head_importance=True)
    G = out.head_importances["encoder.layers.1.self_attn"]
    mask = batch()["attention_mask"].bool()
    np.testing.assert_allclose(means["encoder.layers.1.self_attn"], G[mask].mean(0).double().numpy(), rtol=1e-5)
    assert sum(means["decoder.layers.1.encoder_attn"]) == pytest.approx(1.0)
    figures = []
    save = analysis.save_figure
    monkeypatch.setattr(analysis, "save_figure", lambda fig, path: figures.append(fig) or save(fig, path))
    png = plot_head_importance(G[0], [f"t{i}" for i in range(6)], tmp_path / "fig3.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    heatmap, colorbar = figures[0].axes
    assert heatmap.images[0].get_clim() == (0.0, 1.0)  # the whole range of G, whatever this sentence's values
    assert colorbar.get_ylabel() == "head importance G (rows sum to 1)"
    with pytest.raises(ValueError, match=r"importance must be \(tokens, heads\) with 5 tokens, got \(6, 4\)"):
        plot_head_importance(G[0], ["a"] * 5, tmp_path / "bad.png")


def test_mean_head_importance_needs_dhicm():
    from hf_headattn.experiment.analysis import mean_head_importance

    with pytest.raises(ValueError, match="switch DHICM on"):
        mean_head_importance(tiny(encoder_layers=None, decoder_layers=None), [batch()])


def mean_kl_from_uniform(g, log_g, mask):
    from hf_headattn.methods.dhicm.core import importance_statistics, token_weights

    return importance_statistics(g, log_g, token_weights(mask))[0]


def test_mean_kl_is_the_masked_token_mean_of_eq_4():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 5, 4, generator=g, dtype=torch.float64) * 3
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    log_g = torch.log_softmax(scores, -1)
    kl = kl_from_uniform(scores)
    torch.testing.assert_close(mean_kl_from_uniform(log_g.exp(), log_g, mask), kl[mask].mean())
    torch.testing.assert_close(mean_kl_from_uniform(log_g.exp(), log_g, None), kl.mean())
    nearly = 1e-2 * torch.arange(4.0).expand(1, 3, 4)  # KL ~ 6e-5: float32 keeps it (no cancellation with ln H)
    log_g = torch.log_softmax(nearly, -1)
    expected = kl_from_uniform(nearly.double()).mean().float()
    torch.testing.assert_close(mean_kl_from_uniform(log_g.exp(), log_g, None), expected, rtol=1e-3, atol=0)


@pytest.mark.parametrize("weighted", [False, True])
def test_head_mixture_equals_the_composition_of_eq_1_to_4_and_its_gradients_check(weighted):
    """Training's paper-mode path (HeadMixture, a written-out backward) against importance_scores, the softmax,
    combine_heads and Eq. 4's KL composed by autograd: outputs, KL and G equal, float64 gradcheck of output and KL."""
    from hf_headattn.methods.dhicm.core import HeadMixture

    O, x, W, U, V = (t.requires_grad_() for t in random_inputs(B=2, T=3, H=3, d_k=2, d=3, d_m=4))
    weights = torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]], dtype=torch.float64) if weighted else None

    def fused(O, x, W, V):
        out, kl, G = HeadMixture.apply(O.reshape(6, 3, 2), x.reshape(6, 3) @ U.T, W, V,
                                       None if weights is None else weights.view(-1), math.log(3))
        return out.view(2, 3, 4), kl, G.view(2, 3, 3)

    def composed(O, x, W, V):
        scores = importance_scores(O, x @ U.T, W)
        kl = kl_from_uniform(scores)
        return (combine_heads(O, importance_softmax(scores), V), kl.mean() if weights is None else (kl * weights).sum(),
                importance_softmax(scores))

    for got, expected in zip(fused(O, x, W, V), composed(O, x, W, V)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(lambda *args: fused(*args)[:2], (O, x, W, V))
    out, kl, _ = fused(O, x, W, V)
    kl.backward()  # the KL alone (no gradient from the output: None in backward) reaches O, x and W, not V
    assert O.grad.abs().sum() > 0 and x.grad.abs().sum() > 0 and W.grad.abs().sum() > 0
    assert V.grad is None or not V.grad.any()


def test_kl_and_statistics_are_the_means_over_modules_of_each_modules_own():
    """``dhicm_kl`` and ``dhicm_stats`` (``dhicm.collect``): over the three modules, the mean of each one's mean over
    its real tokens of KL(G || uniform) (Eq. 4), of 1 - KL / ln H and of [max_h G_h > 0.9], computed here from the
    read-out G in float64; importances peaked enough that the modules' top-head shares differ."""
    model = tiny()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".dhicm." in name:
                parameter.mul_(100)
    inputs = batch()
    out = model(**inputs, output_head_importance=True)
    masks = {"encoder": inputs["attention_mask"].bool(), "decoder": inputs["labels"].ne(-100)}
    kls, entropies, shares = [], [], []
    for name, importance in out.head_importances.items():
        g = importance[masks[name.split(".")[0]]].double()  # (real tokens, H)
        kl = torch.special.xlogy(g, g * g.shape[-1]).sum(-1).mean()
        kls.append(kl)
        entropies.append(1 - kl / math.log(g.shape[-1]))
        shares.append((g.amax(-1) > 0.9).double().mean())
    assert len(kls) == 3 and len({round(share.item(), 6) for share in shares}) > 1, shares
    for value, expected in ((out.dhicm_kl, kls), (out.dhicm_stats["importance_entropy"], entropies),
                            (out.dhicm_stats["top_head_share"], shares)):
        torch.testing.assert_close(value.double(), torch.stack(expected).mean(), rtol=1e-5, atol=1e-6)
