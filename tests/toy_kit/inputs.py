"""The toy method's own input, ``toy_gate`` (one number per sentence), made by its kit's hooks as SEA's kit makes its
parses: a recipe flag (``--toy_gate_value``), a feature column, a collate hook, and the same column at inference
(from the value the training run recorded on the config). A source holding ``#`` cannot be gated (as a parser may
refuse a line), so that ``translate``'s fallback is exercised without SEA."""

from dataclasses import dataclass, field

import datasets
import numpy as np
import torch

from hf_headattn.experiment.kit import MethodInputError


@dataclass
class ToyArguments:
    toy_gate_value: float = field(default=1.0, metadata={"help": "toy: the gate of every sentence"})


def _gates(texts, value: float) -> list[float]:
    for index, text in enumerate(texts):
        if "#" in text:
            raise MethodInputError(index, f"the toy cannot gate {text!r}")
    return [value] * len(texts)


def prepare_features(raw, features, job):
    """Each split's ``toy_gate`` column; the value is recorded on the config for inference."""
    value = job.args.toy_gate_value
    gated = datasets.DatasetDict({split: features[split].add_column(
        "toy_gate", _gates([pair[job.source] for pair in dataset["translation"]], value))
        for split, dataset in raw.items()})
    if job.config is not None:
        job.config.toy_gate_value = value
    return gated


def collate(features, batch, *, tokenizer, settings, return_tensors):
    gates = np.array([f["toy_gate"] for f in features], dtype=np.float32)  # (B,)
    return {"toy_gate": torch.from_numpy(gates) if return_tensors == "pt" else gates}


def inference_inputs(model, tokenizer, **options):
    value = getattr(model.config, "toy_gate_value", 1.0)
    return lambda texts: [{"toy_gate": gate} for gate in _gates(texts, value)]


def example_inputs(batch_size: int, source_length: int) -> dict:
    return {"toy_gate": torch.rand(batch_size) + 0.5}
