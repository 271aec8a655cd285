"""The loss without the full logits (``losses.linear_label_smoothed_nll_loss``, ``skip_logits``,
``config.loss_without_logits``) equals the loss of the logits, in value and gradients, in the model and the Trainer."""

import json

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model

from conftest import TINY, batch
from hf_headattn import (
    HeadAttnMarianConfig,
    HeadAttnMarianMTModel,
    HeadAttnMBartConfig,
    HeadAttnMBartForConditionalGeneration,
    losses,
)
from hf_headattn.losses import (
    chunked_linear_smoothed_nll,
    chunked_smoothed_nll,
    label_smoothed_nll_loss,
    linear_label_smoothed_nll_loss,
)
from test_losses import _one_step_grads

HAS_TORCH_PATH = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
FAMILIES = {"mbart": (HeadAttnMBartForConditionalGeneration, HeadAttnMBartConfig),
            "marian": (HeadAttnMarianMTModel, HeadAttnMarianConfig)}
METHODS = {"off": {}, "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1], "dropout": 0.0}},
           "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {"heads": [1, 3]}}}}
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


@pytest.fixture(params=["torch", "own"])
def path(request, monkeypatch):
    """Both implementations: torch's ``F.linear_cross_entropy`` (where torch has it) and our chunked fallback."""
    if request.param == "torch" and not HAS_TORCH_PATH:
        pytest.skip("this torch has no F.linear_cross_entropy")
    if request.param == "own":
        monkeypatch.setattr(losses, "_torch_linear_cross_entropy", lambda hidden: None)
    return request.param


def projection(dtype=torch.float64, rows=21, d=8, vocab=23, seed=0):
    """Hidden states (3, 7, d), weight (V, d), bias (V,) (all requiring grad) and labels (3, 7) with padding."""
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(3, rows // 3, d, generator=generator, dtype=torch.float64)
    weight = torch.randn(vocab, d, generator=generator, dtype=torch.float64)
    bias = torch.randn(vocab, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, vocab, (3, rows // 3), generator=generator)
    labels[1, 4:] = -100
    labels[2, 0] = -100
    return [t.to(dtype).requires_grad_() for t in (hidden, weight, bias)] + [labels]


def reference(hidden, weight, bias, labels, epsilon):
    """``label_smoothed_nll_loss`` of the full logits, in float64: the sums and the gradients of ``loss + 0.3 * nll``
    w.r.t. hidden, weight and bias."""
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight, bias)]
    loss_sum, nll_sum, count = label_smoothed_nll_loss(F.linear(*leaves), labels, epsilon)
    grads = torch.autograd.grad(loss_sum + 0.3 * nll_sum, leaves)
    return (loss_sum, nll_sum, count), grads


def run(hidden, weight, bias, labels, epsilon, rows=None):
    sums = linear_label_smoothed_nll_loss(hidden, weight, bias, labels, epsilon, rows=rows)
    return sums, torch.autograd.grad(sums[0] + 0.3 * sums[1], (hidden, weight, bias))


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("rows", [None, 5])  # one chunk; several, the last one short
def test_float64_loss_and_grads_equal_the_logits_loss(path, epsilon, rows):
    hidden, weight, bias, labels = projection()
    (loss, nll, count), grads = run(hidden, weight, bias, labels, epsilon, rows)
    (ref_loss, ref_nll, ref_count), ref_grads = reference(hidden, weight, bias, labels, epsilon)
    assert count.item() == ref_count.item() == 17
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(nll, ref_nll, rtol=1e-12, atol=1e-12)
    assert (epsilon == 0) == torch.equal(loss, nll)
    for grad, ref in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_low_precision_is_within_its_tolerance(path, epsilon, dtype):
    hidden, weight, bias, labels = projection(dtype, rows=96, d=32, vocab=200)
    (loss, nll, _), grads = run(hidden, weight, bias, labels, epsilon, rows=40)
    (ref_loss, ref_nll, _), ref_grads = reference(hidden, weight, bias, labels, epsilon)
    assert loss.dtype == nll.dtype == torch.float32
    # bf16: the logits and the gradients' matmuls round to 8 bits of mantissa (2**-8 = 0.4%), as on the logits path
    tolerance = 1e-2 if dtype == torch.bfloat16 else 1e-5
    # a sum in float32 (bf16 inputs take our function on both paths): the roundings average out
    sum_tolerance = tolerance / 10
    assert loss.item() == pytest.approx(ref_loss.item(), rel=sum_tolerance)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=sum_tolerance)
    for grad, ref in zip(grads, ref_grads):
        assert grad.dtype == dtype
        assert ((grad.double() - ref).norm() / ref.norm()).item() < tolerance


def test_all_labels_ignored_gives_zero_and_finite_grads(path):
    hidden, weight, bias, labels = projection()
    (loss, nll, count), grads = run(hidden, weight, bias, torch.full_like(labels, -100), 0.1)
    assert loss.item() == nll.item() == count.item() == 0
    assert all(torch.isfinite(g).all() and not g.any() for g in grads)


def test_gradcheck_of_our_chunked_functions():
    hidden, weight, bias, labels = projection(rows=9, d=4, vocab=6)
    flat = labels.reshape(-1)
    assert torch.autograd.gradcheck(
        lambda h, w, b: chunked_linear_smoothed_nll(h.reshape(-1, 4), w, b, flat, 0.2, 4), (hidden, weight, bias))
    logits = torch.randn(9, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: chunked_smoothed_nll(z, flat, 0.2, 4), (logits,))


@pytest.mark.parametrize("epsilon", [0.0, 0.3])
@pytest.mark.parametrize("wanted", [(True, False, False), (False, True, True), (True, True, False)])
def test_gradcheck_of_the_gradients_computed_in_the_forward(epsilon, wanted):
    """The gradients the forward keeps (only those wanted) and the backward scales, float64, without a bias too."""
    hidden, weight, bias, labels = projection(rows=9, d=4, vocab=6, seed=3)
    flat = labels.reshape(-1)
    inputs = [t.detach().requires_grad_(want) for t, want in zip((hidden.reshape(-1, 4), weight, bias), wanted)]
    assert torch.autograd.gradcheck(
        lambda *args: chunked_linear_smoothed_nll(*args, flat, epsilon, 2), inputs)
    assert torch.autograd.gradcheck(
        lambda h, w: chunked_linear_smoothed_nll(h, w, None, flat, epsilon, 4), inputs[:2])


def matrix_products(function):
    """The dtypes of the matrix products (``aten::mm``/``addmm``/``addmm_``, inside custom operators too) that
    ``function()`` runs, one entry per product: the dtypes of its two matrices."""
    with torch.profiler.profile(record_shapes=True) as profile:
        function()
    return [tuple(dtype for dtype, shape in zip(event.input_dtypes, event.input_shapes) if len(shape) == 2)[-2:]
            for event in profile.events() if event.name in ("aten::mm", "aten::addmm", "aten::addmm_")]


def test_each_chunk_takes_three_products_in_the_autocast_dtype_and_the_backward_none(monkeypatch):
    """Under bf16 autocast, with a gradient: per chunk one product for the logits and two for the gradients of
    hidden and weight, all of bf16 matrices, in the forward; the backward only scales (no logits recomputed). Without
    a gradient (evaluation): one product per chunk."""
    monkeypatch.setattr(losses, "_torch_linear_cross_entropy", lambda hidden: None)  # ours for float32 too
    hidden, weight, bias, labels = projection(torch.float32, rows=96, d=32, vocab=200)  # 5 chunks of 20 rows
    bf16 = ("c10::BFloat16", "c10::BFloat16")
    for epsilon in (0.0, 0.1):
        def forward():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return linear_label_smoothed_nll_loss(hidden, weight, bias, labels, epsilon, rows=20)
        sums = []
        assert matrix_products(lambda: sums.extend(forward())) == [bf16] * 15
        assert matrix_products(lambda: (sums[0] + 0.3 * sums[1]).backward()) == []
        with torch.no_grad():
            assert matrix_products(forward) == [bf16] * 5
    products = matrix_products(lambda: run(hidden, weight, bias, labels, 0.1, rows=20))  # float32, no autocast
    assert products == [("float", "float")] * 15


def test_weight_gradient_is_summed_over_the_chunks_in_float32():
    """48 chunks of bf16 inputs: the kept weight gradient (float32) is the float64 product of the bf16-rounded
    logits' gradient within 2.5e-3 relative (1.5e-3: each chunk's bf16 product rounded once; summed in bf16 across
    the chunks, 4.1e-3); hidden's (bf16) and the bias's within their roundings."""
    hidden, weight, bias, labels = (t.detach() for t in projection(torch.bfloat16, rows=96, d=32, vocab=200))
    hidden, labels = hidden.reshape(-1, 32), labels.reshape(-1)
    sums, grad_hidden, grad_weight, grad_bias = losses._linear_nll_forward(hidden, weight, bias, labels, 0.1, 2,
                                                                           True, True, True)
    logits = F.linear(hidden.double(), weight.double(), bias.double()).bfloat16().double()  # the bf16 logits
    lse = losses.smoothed_nll_terms(logits, labels, 0.1)[2]
    grad = losses.smoothed_nll_grad(logits, lse, labels, 0.1, torch.tensor(1.0, dtype=torch.float64),
                                    torch.tensor(0.0, dtype=torch.float64))
    relative = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    assert sums.dtype == grad_weight.dtype == grad_bias.dtype == torch.float32 and grad_hidden.dtype == torch.bfloat16
    assert relative(grad_bias, grad.sum(0)) < 1e-6
    grad = grad.bfloat16().double()  # what the products multiply
    assert relative(grad_weight, grad.T @ hidden.double()) < 2.5e-3
    assert relative(grad_hidden, grad @ weight.double()) < 2 ** -8


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_half_precision_logits_loss_is_float32_without_a_float32_copy(epsilon):
    """The logits path (``label_smoothed_nll_loss``) of bf16 logits: float32 sums, bf16 gradient, float64's values;
    autograd keeps the bf16 logits and (N,) float32 statistics, no (N, V) float32 tensor."""
    hidden, weight, bias, labels = projection(rows=96, d=32, vocab=200)
    logits = F.linear(hidden, weight, bias).detach().bfloat16().requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        loss, nll, _ = label_smoothed_nll_loss(logits, labels, epsilon)
    (loss + 0.3 * nll).backward()
    ref_logits = logits.detach().double().requires_grad_()
    ref_loss, ref_nll, _ = label_smoothed_nll_loss(ref_logits, labels, epsilon)
    (ref_loss + 0.3 * ref_nll).backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(logits.grad.double(), ref_logits.grad, rtol=1e-2, atol=1e-3)
    assert not any(t.dtype == torch.float32 and t.numel() >= logits.numel() for t in saved)


def model(family="mbart", method="off", **config):
    torch.manual_seed(0)
    model_cls, config_cls = FAMILIES[family]
    return model_cls(config_cls(**TINY, **NO_DROPOUT, label_smoothing=0.1, **METHODS[method], **config)).train()


def loss_and_grads(net, **kwargs):
    net.zero_grad(set_to_none=True)
    out = net(**batch(), **kwargs)
    out.loss.backward()
    return out, {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_model_loss_components_and_grads_equal_with_and_without_logits(family, method):
    net = model(family, method)
    with_logits, grads = loss_and_grads(net, skip_logits=False)
    without, skipped_grads = loss_and_grads(net, skip_logits=True)
    assert with_logits.logits is not None and without.logits is None
    fields = ["loss", "nll_loss", *{"dhicm": ["dhicm_kl"], "eadra": ["eadra_loss"]}.get(method, [])]
    for field in fields:
        torch.testing.assert_close(without[field], with_logits[field], rtol=1e-5, atol=1e-6, msg=field)
    assert grads.keys() == skipped_grads.keys()
    for name in grads:
        torch.testing.assert_close(skipped_grads[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


def bf16_autocast_step(net, inputs, skip_logits, parts=1):
    """Loss, nll and gradients of one step under bf16 autocast, the batch's rows in ``parts`` micro-batches (the
    gradients accumulated in the parameters' float32, as the Trainer's gradient accumulation does)."""
    net.zero_grad(set_to_none=True)
    rows, count = len(inputs["labels"]), inputs["labels"].ne(-100).sum()
    loss = nll = 0.0
    for part in range(parts):
        piece = {key: value[part * rows // parts:(part + 1) * rows // parts] for key, value in inputs.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(**piece, skip_logits=skip_logits, num_items_in_batch=count)
        out.loss.backward()
        loss, nll = loss + out.loss.item(), nll + out.nll_loss.item() * (piece["labels"].ne(-100).sum() / count).item()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    return loss, nll, torch.cat([grad.flatten() for grad in grads.values()]), grads["model.shared.weight"]


def float32_step(net, inputs):
    """The gradients of one float32 step (no autocast) on the logits path: the reference of the bf16 steps."""
    net.zero_grad(set_to_none=True)
    net(**inputs, skip_logits=False, num_items_in_batch=inputs["labels"].ne(-100).sum()).loss.backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters() if p.grad is not None}
    return torch.cat([grad.flatten() for grad in grads.values()]), grads["model.shared.weight"]


def test_bf16_autocast_loss_and_grads_equal_the_logits_path(path, monkeypatch):
    """Under bf16 autocast the loss without the logits is the logits path's: the per-token terms of the same bf16
    logits, summed in float32 (torch's op sums in bf16: 0.17-0.20% off). Its gradients are as close to a float32
    step's as the logits path's (all the parameters, and the tied output projection, whose gradient sums 20 chunks):
    3.0e-3 and 2.9e-3 relative, the logits path 3.2e-3 and 3.1e-3. They are not the logits path's bit for bit: the
    gradient is computed in the forward, its logits' gradient rounded to bf16 before it is scaled (by
    1/num_items_in_batch), so the roundings differ (3.2e-3 apart; two stock steps, the batch whole and in two
    micro-batches, 1.7e-3). Before, the weight gradient summed in bf16 across the chunks: 4.1e-3 and 4.7e-3 off the
    logits path, torch's op 5.3e-3 and 5.7e-3."""
    monkeypatch.setattr(losses, "chunk_rows", lambda *shape: 8)  # 20 chunks: the weight's gradient summed over them
    torch.manual_seed(0)
    net = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(
        **{**TINY, "vocab_size": 1000, "d_model": 64}, **NO_DROPOUT, label_smoothing=0.1)).train()
    generator = torch.Generator().manual_seed(1)
    source, labels = torch.randint(3, 1000, (8, 24), generator=generator), torch.randint(3, 1000, (8, 20),
                                                                                        generator=generator)
    labels[1, 10:] = -100
    inputs = {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": labels}
    loss, nll, grads, head = bf16_autocast_step(net, inputs, skip_logits=False)
    skipped_loss, skipped_nll, skipped_grads, skipped_head = bf16_autocast_step(net, inputs, skip_logits=True)
    exact_grads, exact_head = float32_step(net, inputs)
    assert skipped_loss == pytest.approx(loss, rel=1e-4) and skipped_nll == pytest.approx(nll, rel=1e-4)
    relative = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert relative(skipped_grads, exact_grads) < 1.05 * relative(grads, exact_grads)
    assert relative(skipped_head, exact_head) < 1.05 * relative(head, exact_head)


def test_skip_logits_default_follows_config_training_and_labels():
    net = model(loss_without_logits=True)
    assert net(**batch()).logits is None  # training, labels, option on
    assert net(**batch(), skip_logits=False).logits is not None
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    assert net(**inputs, decoder_input_ids=batch()["labels"].clamp(min=1)).logits is not None  # no labels
    with torch.no_grad():
        assert net.eval()(**batch()).logits is not None  # evaluation
        assert net(**batch(), skip_logits=True).logits is None  # (what the Trainer asks with Liger on)
    assert model()(**batch()).logits is not None  # option off (the default)


def test_skip_logits_refuses_what_it_cannot_do():
    net = model()
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    with pytest.raises(ValueError, match="skip_logits=True .* needs labels, got none"):
        net(**inputs, decoder_input_ids=batch()["labels"].clamp(min=1), skip_logits=True)
    with pytest.raises(ValueError, match="skip_logits must be True, False or None, got 'yes'"):
        net(**batch(), skip_logits="yes")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generate_and_return_dict_false_work_with_the_option_on(family):
    on, off = model(family, loss_without_logits=True), model(family)
    inputs = {k: v for k, v in batch().items() if k != "labels"}
    with torch.no_grad():
        tokens = on.generate(**inputs, max_new_tokens=4, do_sample=False, num_beams=2)
        assert torch.equal(tokens, off.generate(**inputs, max_new_tokens=4, do_sample=False, num_beams=2))
    as_tuple = on(**batch(), return_dict=False)
    torch.testing.assert_close(as_tuple[0], off(**batch()).loss)
    assert as_tuple[1].shape == on(**batch()).encoder_last_hidden_state.shape  # no logits in the tuple


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_config_option_round_trips_and_old_configs_load_without_it(tmp_path, family):
    model_cls, config_cls = FAMILIES[family]
    config_cls(**TINY, loss_without_logits=True).save_pretrained(tmp_path / "on")
    assert json.loads((tmp_path / "on" / "config.json").read_text())["loss_without_logits"] is True
    assert config_cls.from_pretrained(tmp_path / "on").loss_without_logits is True
    config_cls(**TINY).save_pretrained(tmp_path / "old")  # a config.json written before the option existed
    saved = json.loads((tmp_path / "old" / "config.json").read_text())
    saved.pop("loss_without_logits")
    (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
    assert config_cls.from_pretrained(tmp_path / "old").loss_without_logits is False
    stock = {"mbart": "MBartConfig", "marian": "MarianConfig"}[family]
    getattr(__import__("transformers"), stock)(**TINY).save_pretrained(tmp_path / "stock")
    assert config_cls.from_pretrained(tmp_path / "stock", loss_without_logits=True).loss_without_logits is True
    with pytest.raises(ValueError, match="loss_without_logits must be True or False, got 'yes'"):
        config_cls(**TINY, loss_without_logits="yes")
    config = config_cls(**TINY)
    with pytest.raises(ValueError, match="loss_without_logits must be True or False, got 1"):
        config.loss_without_logits = 1
    assert config.loss_without_logits is False


def test_lora_on_attention_uses_the_projection_and_a_wrapped_head_gets_logits():
    net = model(loss_without_logits=True)
    reference, reference_grads = loss_and_grads(model(), skip_logits=False)
    lora = get_peft_model(net, LoraConfig(target_modules=["q_proj", "v_proj"], r=2, init_lora_weights=True)).train()
    out = lora(**batch())
    assert out.logits is None
    torch.testing.assert_close(out.loss, reference.loss)
    wrapped = get_peft_model(model(loss_without_logits=True),
                             LoraConfig(target_modules=["q_proj", "lm_head"], r=2, init_lora_weights=True)).train()
    out = wrapped(**batch())
    assert out.logits is not None  # the head's weight alone is not the projection: the loss goes through logits
    torch.testing.assert_close(out.loss, reference.loss)
    with pytest.raises(ValueError, match="needs a plain nn.Linear output projection"):
        wrapped(**batch(), skip_logits=True)


@pytest.mark.slow
def test_trainer_gradient_accumulation_and_evaluation_with_the_option_on(tmp_path):
    """Two accumulated micro-batches of 4 give the gradients of one batch of 8, and those of the logits loss; the
    Trainer's evaluation gets logits and the same loss."""
    full, trainer = _one_step_grads(tmp_path / "full", 8, 1, label_smoothing_factor=0.1, loss_without_logits=True)
    accumulated, _ = _one_step_grads(tmp_path / "acc", 4, 2, label_smoothing_factor=0.1, loss_without_logits=True)
    logits_path, reference = _one_step_grads(tmp_path / "logits", 8, 1, label_smoothing_factor=0.1)
    assert full.keys() == accumulated.keys() == logits_path.keys() and full
    for name in full:
        torch.testing.assert_close(accumulated[name], full[name], atol=1e-6, rtol=1e-4, msg=name)
        torch.testing.assert_close(full[name], logits_path[name], atol=1e-6, rtol=1e-4, msg=name)
    logged = [entry for entry in trainer.state.log_history if "loss" in entry][0]
    expected = [entry for entry in reference.state.log_history if "loss" in entry][0]
    assert logged["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert logged["nll_loss"] == pytest.approx(expected["nll_loss"], abs=1e-5)
    dataset = trainer.train_dataset
    prediction = trainer.predict(dataset)
    assert prediction.predictions[0].shape[-1] == TINY["vocab_size"]  # logits, not None
    assert prediction.metrics["test_loss"] == pytest.approx(reference.predict(dataset).metrics["test_loss"], rel=1e-5)
