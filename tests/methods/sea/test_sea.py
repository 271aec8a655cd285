"""SEA + RHE in the models: forced RHE situations, backends, generation, read-out, errors, checkpoints."""

import json

import pytest
import torch
from transformers import MBartConfig, MBartForConditionalGeneration

from conftest import FAMILIES, TINY, batch, greedy_by_full_forward
from hf_headattn import HeadAttnMBartForConditionalGeneration
from hf_headattn.biased_attention import BiasedAttention
from hf_headattn.experiment.analysis import count_redundant_heads, redundancy_report
from hf_headattn.syntax_inputs import NOT_IN_PHRASE

LAYER0 = "encoder.layers.0.self_attn"
LPEA_KEYS = {f"model.{LAYER0}.sea.lpea_{n}" for n in ("embeddings", "weight", "bias", "projection")}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A stock mBART checkpoint with large random weights (init_std 0.5), so that attention changes the logits."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("sea-mbart")
    MBartForConditionalGeneration(MBartConfig(**TINY, init_std=0.5)).save_pretrained(path)
    return path


def load(path, attn_implementation="sdpa", **sea):
    """The checkpoint with ``config.sea = sea`` (keyword arguments: SEA's settings)."""
    return HeadAttnMBartForConditionalGeneration.from_pretrained(
        path, attn_implementation=attn_implementation, sea=sea).eval()


def stock(path):
    return MBartForConditionalGeneration.from_pretrained(path).eval()


def syntax(related_rows=(0, 1)):
    """dependency_mask and phrase_positions for :func:`batch` (6 tokens; row 1 has 4 real ones).

    Sentences in ``related_rows`` relate every real token to every other (Syn_attn = 1: no head redundant); the
    others relate each token to itself only (Syn_attn = the diagonal mass: every head redundant here).
    """
    real = batch()["attention_mask"].bool()  # (2, 6)
    both = real[:, :, None] & real[:, None, :]  # (2, 6, 6)
    eye = torch.eye(6, dtype=torch.bool).expand(2, 6, 6)
    related = torch.tensor([b in related_rows for b in range(2)])[:, None, None]
    dependency = (both & related) | eye
    g = torch.Generator().manual_seed(3)
    positions = torch.randint(-8, 9, (2, 6, 6), generator=g)  # beyond +-k: clipped
    positions[(torch.rand(2, 6, 6, generator=g) < 0.3) | ~both] = NOT_IN_PHRASE
    return {"dependency_mask": dependency, "phrase_positions": positions}


def logits(model, related_rows=(0, 1), **extra):
    with torch.no_grad():
        return model(**batch(), **syntax(related_rows), **extra)


@pytest.mark.parametrize("sea_type", ["dea", "lpea"])
def test_forced_rhe_equals_sea_on_all_heads_or_plain_attention(checkpoint, sea_type):
    rhe = load(checkpoint, type=sea_type, head_selection="redundant")
    everywhere = load(checkpoint, type=sea_type, head_selection="all")
    everywhere.load_state_dict(rhe.state_dict())
    plain = stock(checkpoint)(**batch()).logits.detach()
    # every head redundant: +SEA+RHE is +SEA on all heads, which differs from plain attention
    out = logits(rhe, related_rows=(), output_redundant_heads=True)
    assert out.redundant_heads[LAYER0].all()
    torch.testing.assert_close(out.logits, logits(everywhere, related_rows=()).logits, atol=1e-5, rtol=0)
    assert (out.logits - plain).abs().max() > 1e-2
    # no head redundant: +SEA+RHE is the plain model
    out = logits(rhe, related_rows=(0, 1), output_redundant_heads=True)
    assert not out.redundant_heads[LAYER0].any()
    torch.testing.assert_close(out.logits, plain, atol=1e-5, rtol=0)


def test_rhe_selects_per_sentence(checkpoint):
    rhe = load(checkpoint, type="lpea", head_selection="redundant")
    everywhere = load(checkpoint, type="lpea", head_selection="all")
    everywhere.load_state_dict(rhe.state_dict())
    out = logits(rhe, related_rows=(0,), output_redundant_heads=True)
    assert out.redundant_heads[LAYER0].tolist() == [[False] * 4, [True] * 4]
    torch.testing.assert_close(out.logits[0], stock(checkpoint)(**batch()).logits[0].detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.logits[1], logits(everywhere, (0,)).logits[1], atol=1e-5, rtol=0)


SETTINGS = [
    dict(type="dea", head_selection="all"), dict(type="dea", head_selection="redundant"),
    dict(type="lpea", head_selection="all"), dict(type="lpea", head_selection="redundant"), dict(prune=True),
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(map(str, s.values())))
def test_eager_and_sdpa_agree(checkpoint, settings):
    sdpa = load(checkpoint, "sdpa", **settings)
    eager = load(checkpoint, "eager", **settings)
    eager.load_state_dict(sdpa.state_dict())
    a, b = logits(sdpa, (0,), output_redundant_heads=True), logits(eager, (0,), output_redundant_heads=True)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(a.redundant_heads[LAYER0], b.redundant_heads[LAYER0])
    assert torch.isfinite(a.logits).all()


def test_rhe_prune_zeroes_exactly_the_redundant_heads(checkpoint):
    model = load(checkpoint, prune=True)
    seen = []
    hook = model.model.encoder.layers[0].self_attn.out_proj.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    out = logits(model, related_rows=(0,), output_redundant_heads=True)
    hook.remove()
    heads = seen[0].reshape(2, 6, 4, 4)  # (B, T, H, D)
    per_head_norm = heads.abs().sum((1, 3))  # (B, H)
    assert torch.equal(per_head_norm == 0, out.redundant_heads[LAYER0])
    assert out.redundant_heads[LAYER0].tolist() == [[False] * 4, [True] * 4]
    plain = stock(checkpoint)(**batch()).logits.detach()
    torch.testing.assert_close(out.logits[0], plain[0], atol=1e-5, rtol=0)


def test_lpea_parameters_get_gradients_only_through_selected_heads(checkpoint, monkeypatch):
    """LPEA's parameters get a gradient where RHE selects heads, zeros where it selects none; SDPA's gradients (its
    kernel on the mask with the selected heads' bias in it, the bias's gradient from biased_attention's backward:
    issue 63) are eager's (autograd through the probabilities)."""
    fast = []
    apply = BiasedAttention.apply
    monkeypatch.setattr(BiasedAttention, "apply", lambda *args: fast.append(1) or apply(*args))
    for related_rows, expect_grad in (((), True), ((0, 1), False)):
        results = []
        for backend in ("sdpa", "eager"):
            torch.manual_seed(0)  # (the same LPEA parameters, missing from the checkpoint, and dropout)
            model = load(checkpoint, backend, type="lpea", head_selection="redundant").train()
            model(**batch(), **syntax(related_rows)).loss.backward()
            results.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
            grads = [p.grad for n, p in model.named_parameters() if ".sea.lpea_" in n]
            assert len(grads) == 4 and all(g is not None for g in grads)  # zeros, never None: DDP needs no flag
            assert any(g.abs().sum() > 0 for g in grads) == expect_grad
        assert results[0].keys() == results[1].keys()
        for name, grad in results[0].items():
            torch.testing.assert_close(grad, results[1][name], atol=1e-5, rtol=1e-4, msg=name)
    assert fast == [1, 1]  # SDPA's layer 0 took it, with heads selected or none


def test_sea_off_attaches_nothing_and_ignores_syntax(checkpoint):
    model = load(checkpoint, head_selection="all", encoder_layers=[1], max_relative_position=3)
    assert not any(".sea." in n for n, _ in model.named_parameters())
    assert not any(getattr(m, "headattn_methods", ()) for m in model.modules())
    torch.testing.assert_close(logits(model).logits, stock(checkpoint)(**batch()).logits.detach(), atol=1e-5, rtol=0)


def test_only_the_configured_encoder_layers_carry_sea(checkpoint):
    model = load(checkpoint, type="dea", encoder_layers=[-1])
    carriers = {n for n, m in model.named_modules() if "sea" in getattr(m, "headattn_methods", ())}
    assert carriers == {"model.encoder.layers.1.self_attn"}
    out = logits(model, (), output_redundant_heads=True)
    assert set(out.redundant_heads) == {"encoder.layers.1.self_attn"}
    assert out.redundant_heads["encoder.layers.1.self_attn"].dtype == torch.bool
    assert out.redundant_heads["encoder.layers.1.self_attn"].shape == (2, 4)
    assert logits(model).redundant_heads is None



@pytest.mark.parametrize("sea_type", ["dea", "lpea"])
def test_generate_with_beams_and_cache(checkpoint, sea_type):
    model = load(checkpoint, type=sea_type, head_selection="redundant")
    inputs = {k: v for k, v in batch().items() if k != "labels"} | syntax(related_rows=(0,))
    settings = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False)
    greedy = model.generate(**inputs, num_beams=1, **settings)
    assert torch.equal(greedy, greedy_by_full_forward(model, inputs, 6))
    beams = model.generate(**inputs, num_beams=3, **settings)
    assert torch.equal(beams, model.generate(**inputs, num_beams=3, use_cache=False, **settings))
    plain = {k: v for k, v in inputs.items() if k not in syntax()}
    with pytest.raises(ValueError, match="dependency_mask"):  # the encoder inside generate reads the syntax inputs
        model.generate(**plain, num_beams=3, **settings)


def bad(name, value):
    inputs = syntax()
    inputs[name] = value
    return inputs


ERRORS = [
    ({"type": "lpea"}, {"dependency_mask": None},
     r"needs the forward argument dependency_mask .*DataCollatorForSyntaxSeq2Seq"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": None}, r"needs the forward argument phrase_pos"),
    ({"prune": True}, {"dependency_mask": None}, r"needs the forward argument dependency_mask"),
    ({"type": "dea"}, {"dependency_mask": torch.ones(2, 5, 5, dtype=torch.bool)},
     r"dependency_mask has shape \(2, 5, 5\), expected \(batch, src_len, src_len\) = \(2, 6, 6\)"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": torch.zeros(1, 6, 6, dtype=torch.long)},
     r"phrase_positions has shape \(1, 6, 6\), expected .* \(2, 6, 6\)"),
    ({"type": "dea"}, {"dependency_mask": torch.ones(2, 6, 6, dtype=torch.long)}, r"must be torch.bool"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": torch.zeros(2, 6, 6)},
     r"phrase_positions must be an integer tensor .*torch.float32"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": torch.full((2, 6, 6), NOT_IN_PHRASE - 1)},
     r"phrase_positions contains -10001: expected .* or NOT_IN_PHRASE = -10000"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": torch.full((2, 6, 6), 10000)},
     r"phrase_positions contains 10000"),
    ({"type": "lpea", "head_selection": "all"}, {"phrase_positions": torch.full((2, 6, 6), -100)},  # was clipped
     r"phrase_positions contains -100 \(the label padding value -100.*NOT_IN_PHRASE = -10000 outside the local phrase "
     r"and on padding"),
    ({"type": "dea"}, {"dependency_mask": torch.ones(2, 6, 6, dtype=torch.bool, device="meta")},
     r"dependency_mask is on meta but the model runs on cpu; move it with dependency_mask.to\(model.device\)"),
]


@pytest.mark.parametrize("settings, change, message", ERRORS)
def test_bad_inputs_raise_clear_errors(checkpoint, settings, change, message):
    model = load(checkpoint, **settings)
    inputs = syntax() | change
    with pytest.raises(ValueError, match=message):
        model(**batch(), **{k: v for k, v in inputs.items() if v is not None})


def test_inputs_that_are_not_needed_are_not_required(checkpoint):
    model = load(checkpoint, type="lpea", head_selection="all")  # no RHE: no dependency mask needed
    model(**batch(), phrase_positions=syntax()["phrase_positions"])
    with pytest.raises(ValueError, match="dependency_mask"):  # unless the read-out is asked for
        model(**batch(), phrase_positions=syntax()["phrase_positions"], output_redundant_heads=True)


def test_save_load_round_trip_keeps_lpea_parameters(checkpoint, tmp_path):
    model = load(checkpoint, type="lpea", max_relative_position=4)
    assert model.model.encoder.layers[0].self_attn.sea.lpea_embeddings.shape == (9, 4)
    model.save_pretrained(tmp_path)
    again, info = HeadAttnMBartForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert again.config.sea == {"type": "lpea", "max_relative_position": 4}
    saved = {k: v for k, v in model.state_dict().items() if ".sea." in k}
    assert set(saved) == LPEA_KEYS
    for key, value in saved.items():
        assert torch.equal(again.state_dict()[key], value), key
    torch.testing.assert_close(logits(again.eval(), (0,)).logits, logits(model, (0,)).logits)


def test_stock_checkpoint_loads_with_sea_on(stock_checkpoint):
    family, path = stock_checkpoint
    ours = FAMILIES[family][2]
    model, info = ours.from_pretrained(path, sea={"type": "lpea"}, output_loading_info=True)
    assert set(info["missing_keys"]) == LPEA_KEYS and not info["unexpected_keys"]
    sea = model.model.encoder.layers[0].self_attn.sea
    assert torch.isfinite(sea.label_bias()).all() and 0.5 < sea.lpea_embeddings.std() < 1.5  # initialised
    assert torch.isfinite(logits(model.eval(), (0,)).logits).all()
    _, info = ours.from_pretrained(path, sea={"type": "dea"}, output_loading_info=True)
    assert not info["missing_keys"]


def test_redundancy_report_counts_sentences(checkpoint, tmp_path):
    model = load(checkpoint, type="lpea").train()  # the report runs without dropout, then restores the mode
    first = {**batch(), **syntax(related_rows=(0,))}  # sentence 0: no head redundant, sentence 1: all
    second = {k: v[1:] for k, v in first.items()}
    report = redundancy_report(model, [first, second], plot_path=tmp_path / "rhe.png")
    assert report["sentences"] == 3
    assert report["modules"][LAYER0]["redundant_count"] == [2] * 4
    assert report["modules"][LAYER0]["redundant_frequency"] == pytest.approx([2 / 3] * 4)
    assert report["settings"]["type"] == "lpea"
    assert json.loads(json.dumps(report)) == report
    assert (tmp_path / "rhe.png").read_bytes()[:4] == b"\x89PNG"
    assert model.training
    with pytest.raises(ValueError, match="no redundant-head labels"):
        count_redundant_heads([{}])


def test_unpadded_batch_gives_the_same_sentence(checkpoint):
    """Without padding HF passes no mask; the per-sentence result must not depend on the batch it sits in."""
    model = load(checkpoint, type="lpea", head_selection="redundant")
    both = logits(model, related_rows=(1,), output_redundant_heads=True)
    inputs = {k: v[:1] for k, v in (batch() | syntax(related_rows=(1,))).items()}
    with torch.no_grad():
        alone = model(**inputs, output_redundant_heads=True)
    assert alone.redundant_heads[LAYER0].tolist() == [[True] * 4] == both.redundant_heads[LAYER0][:1].tolist()
    torch.testing.assert_close(alone.logits[0], both.logits[0], atol=1e-5, rtol=0)


def test_lpea_label_bias_and_input_check_launch_few_operators(monkeypatch):
    """LPEA+RHE's host work (issue #47: 1.08x stock eager on an H100, host-bound): the label bias is computed in the
    parameters' dtype even under autocast (no cast of its four parameters forward or backward: 11 operators before),
    and the device-side check of ``phrase_positions`` takes 8 operators (9 before), still catching every bad value."""
    from hf_headattn.methods.sea import core as sea_module
    from operator_count import OperatorCounter

    layer = sea_module.SEA(sea_module.SEASettings(type="lpea"), head_dim=8)
    layer.init_weights(0.02)
    counts, values = [], []
    for autocast in (False, True):
        layer.zero_grad(set_to_none=True)
        with OperatorCounter() as counted:
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):  # backward outside it, as the Trainer's
                values.append(layer.label_bias())
            values[-1].sum().backward()
        counts.append(counted.count)
    assert counts[1] == counts[0] and values[1].dtype == torch.float32  # (11 more operators under autocast before)
    torch.testing.assert_close(values[1], values[0])

    monkeypatch.setattr(sea_module, "_checks_on_host", lambda tensor: False)  # the GPU's path: a device assertion
    query = torch.zeros(2, 4, 5, 8)
    good = torch.tensor([NOT_IN_PHRASE, -9999, 9999, 0, -99]).expand(2, 5, 5).clone()
    with OperatorCounter() as counted:
        sea_module.check_input("phrase_positions", good, query, 6)
    assert counted.count <= 4 and not counted.syncs  # bucketize, bitwise_and, all, the assertion (8 before)
    for value in (NOT_IN_PHRASE - 1, -NOT_IN_PHRASE, -100):
        bad = good.clone()
        bad[1, 2, 3] = value
        with pytest.raises(RuntimeError, match="phrase_positions contains an invalid value"):
            sea_module.check_input("phrase_positions", bad, query, 6)


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.int16])
def test_valid_phrase_positions_eager_and_compiled_agree(monkeypatch, dtype):
    from hf_headattn.methods.sea import core as sea_module

    values = torch.tensor([NOT_IN_PHRASE - 1, NOT_IN_PHRASE, -101, -100, -99, 0, 6, 9999, 10000], dtype=dtype)
    expected = [False, True, True, False, True, True, True, True, False]
    assert sea_module.valid_phrase_positions(values).bool().tolist() == expected  # eager: bucketize
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert sea_module.valid_phrase_positions(values).tolist() == expected  # compiled: the comparisons
