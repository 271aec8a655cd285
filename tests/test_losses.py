"""The loss: label smoothing against independent computations, and exact gradient accumulation in the Trainer."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import Seq2SeqTrainingArguments, TrainerCallback

from conftest import TINY, batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, label_smoothed_nll_loss
from hf_headattn.experiment.trainer import HeadAttnSeq2SeqTrainer
from hf_headattn.losses import total_objective


def numpy_label_smoothed(logits, labels, eps):
    total, nll_total, count = 0.0, 0.0, 0
    for row, label in zip(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)):
        if label == -100:
            continue
        lp = row - (np.log(np.exp(row - row.max()).sum()) + row.max())
        total += (1 - eps) * -lp[label] + eps * -lp.mean()
        nll_total += -lp[label]
        count += 1
    return total, nll_total, count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
def test_label_smoothed_loss_matches_numpy_and_torch(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 5))
    labels[1, 3:] = -100
    loss_sum, nll_sum, n = label_smoothed_nll_loss(logits, labels, eps)
    ref_total, ref_nll, ref_n = numpy_label_smoothed(logits.numpy(), labels.numpy(), eps)
    assert n.item() == ref_n == 13
    assert loss_sum.item() == pytest.approx(ref_total, rel=1e-6)
    assert nll_sum.item() == pytest.approx(ref_nll, rel=1e-6)
    torch_mean = F.cross_entropy(logits.reshape(-1, 11), labels.reshape(-1), label_smoothing=eps)
    assert (loss_sum / n).item() == pytest.approx(torch_mean.item(), rel=1e-6)


def test_label_smoothed_loss_gradcheck():
    logits = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[1, 2, -100], [3, 0, 6]])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll_loss(x, labels, 0.2)[0], (logits,))


def test_total_objective_weights_method_terms_by_token_share():
    loss_sum, n, term = torch.tensor(12.0), torch.tensor(4), torch.tensor(0.5)
    assert total_objective(loss_sum, n, term).item() == pytest.approx(3.5)
    # a micro-batch holding 4 of 10 tokens of the accumulated batch
    assert total_objective(loss_sum, n, term, num_items_in_batch=10).item() == pytest.approx(1.2 + 0.2)


@pytest.mark.parametrize("num_items_in_batch", [0, torch.tensor(0)])
def test_a_batch_without_label_tokens_gives_zero_not_nan(num_items_in_batch):
    # regression: num_items_in_batch=0 (every label -100 in the accumulated batch) gave 0/0 = NaN
    loss = total_objective(torch.tensor(0.0), torch.tensor(0), torch.tensor(0.5), num_items_in_batch)
    assert loss.item() == 0.0
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dhicm={"decoder_layers": [-1]}))
    inputs = {**batch(), "labels": torch.full((2, 4), -100)}
    assert model(**inputs, num_items_in_batch=num_items_in_batch).loss.item() == 0.0


def test_mbart_row_without_targets_costs_nothing_and_does_not_crash():
    # regression: mBART's shift_tokens_right indexed position -1 of a row of -100 only ("index -1 is out of bounds")
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, label_smoothing=0.1)).eval()
    inputs = {**batch(), "labels": torch.tensor([[13, 14, 15, 2], [-100, -100, -100, -100]])}
    first = {key: value[:1] for key, value in inputs.items()}
    with torch.no_grad():
        assert model(**inputs).loss.item() == pytest.approx(model(**first).loss.item(), rel=1e-6)
    shifted = model.prepare_decoder_input_ids_from_labels(inputs["labels"])
    assert shifted.tolist() == [[2, 13, 14, 15], [1, 1, 1, 1]]  # row 0 as mBART shifts it; row 1 all padding
    assert model.prepare_decoder_input_ids_from_labels(inputs["labels"][1:]).tolist() == [[1, 1, 1, 1]]


def test_model_applies_config_label_smoothing():
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, label_smoothing=0.1)).eval()
    with torch.no_grad():
        out = model(**batch())
    labels = batch()["labels"]
    expected = F.cross_entropy(out.logits.reshape(-1, 99), labels.reshape(-1), label_smoothing=0.1)
    nll = F.cross_entropy(out.logits.reshape(-1, 99), labels.reshape(-1))
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert out.nll_loss.item() == pytest.approx(nll.item(), rel=1e-5)
    assert not math.isclose(out.loss.item(), out.nll_loss.item(), rel_tol=1e-3)


class GradRecorder(TrainerCallback):
    def __init__(self):
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _toy_dataset():
    """8 examples with different numbers of label tokens, so micro-batches hold different token counts."""
    rows = {"input_ids": [], "attention_mask": [], "labels": []}
    for i in range(8):
        length = 3 + i % 4
        ids = [5 + (i + j) % 90 for j in range(length)] + [2] + [1] * (8 - length)
        rows["input_ids"].append(ids)
        rows["attention_mask"].append([int(t != 1) for t in ids])
        rows["labels"].append([7 + (2 * i + j) % 80 for j in range(1 + i)] + [2] + [-100] * (8 - i))
    return Dataset.from_dict(rows).with_format("torch")


def _one_step_grads(tmp_path, batch_size, accumulation, label_smoothing_factor=0.0, **config):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dropout=0.0, **config))
    recorder = GradRecorder()
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / f"run{batch_size}"), per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1e-3, report_to=[], use_cpu=True,
        logging_steps=1, save_strategy="no", label_smoothing_factor=label_smoothing_factor, seed=0,
    )
    trainer = HeadAttnSeq2SeqTrainer(model=model, args=args, train_dataset=_toy_dataset(), callbacks=[recorder])
    trainer.train()
    return recorder.grads, trainer


@pytest.mark.slow
def test_gradient_accumulation_equals_full_batch(tmp_path):
    full, _ = _one_step_grads(tmp_path, 8, 1)
    accumulated, _ = _one_step_grads(tmp_path, 2, 4)
    assert full.keys() == accumulated.keys() and full
    for name in full:
        torch.testing.assert_close(accumulated[name], full[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_trainer_moves_label_smoothing_into_model_and_logs_components(tmp_path):
    _, trainer = _one_step_grads(tmp_path, 8, 1, label_smoothing_factor=0.1)
    assert trainer.model.config.label_smoothing == 0.1 and trainer.label_smoother is None
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    torch.manual_seed(0)  # the same initial weights as the trained model; the step saw the whole dataset once
    reference = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, dropout=0.0, label_smoothing=0.1))
    with torch.no_grad():
        expected = reference(**_toy_dataset()[:])
    assert logged[0]["nll_loss"] == pytest.approx(expected.nll_loss.item(), abs=1e-4)
    assert logged[0]["loss"] == pytest.approx(expected.loss.item(), abs=1e-4)
