"""How often each head of the SEA layers is redundant over a dataset (RHE, Zhang et al. 2021, Eq. 10)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from hf_headattn.methods.sea.core import METHOD
from hf_headattn.plugin import method_inputs, pyplot, save_figure
from hf_headattn.plugin import readout as spec_readout

FLAG, FIELD = spec_readout(METHOD)
"""RHE's read-out: the forward flag that asks for the redundant-head labels, and the output field that holds them."""


def count_redundant_heads(readouts: Iterable[Mapping[str, torch.Tensor]]) -> dict:
    """Sum per-sentence head labels into a JSON-able report.

    Parameters
    ----------
    readouts
        iterable of `{module name: (batch, heads) bool}`, the `redundant_heads` output field.

    Returns
    -------
    :
        `{"sentences": N, "modules": {name: {"redundant_count": [per head], "redundant_frequency": [per head],
        "mean_redundant_heads": float}}}`; a frequency is the share of sentences in which the head is redundant.
    """
    counts: dict[str, torch.Tensor] = {}
    sentences = 0
    for readout in readouts:
        if not readout:
            raise ValueError(f"a batch gave no redundant-head labels: the model needs RHE on (config.{METHOD.name} "
                             f"set) and {FLAG}=True")
        batch_sizes = {labels.shape[0] for labels in readout.values()}
        if len(batch_sizes) != 1:
            raise ValueError(f"the modules' labels disagree on the batch size: {sorted(batch_sizes)}")
        for name, labels in readout.items():  # (B, H) bool
            counts[name] = counts.get(name, 0) + labels.detach().long().sum(0).cpu()
        sentences += batch_sizes.pop()
    modules = {}
    for name, count in counts.items():
        frequency = count.double() / max(sentences, 1)
        modules[name] = {
            "redundant_count": count.tolist(),
            "redundant_frequency": [round(f, 6) for f in frequency.tolist()],
            "mean_redundant_heads": round(float(frequency.sum()), 6),
        }
    return {"sentences": sentences, "modules": modules}


@torch.no_grad()
def redundancy_report(model, batches: Iterable[dict], plot_path: str | Path | None = None) -> dict:
    """Run `model` over `batches` and report how often each head of its SEA layers is redundant (Eq. 10).

    Only the encoder matters, so the decoder gets one start token per sentence (`labels` and
    `decoder_*` entries of the batches are ignored). The model is in eval mode meanwhile (no dropout).

    Parameters
    ----------
    model
        a HeadAttn model with SEA/RHE on (`config.sea`).
    batches : dicts with `input_ids`, `attention_mask`, `dependency_mask` (and `phrase_positions` for
        LPEA), e.g. a `DataLoader` with `DataCollatorForSyntaxSeq2Seq`.
    plot_path
        optional PNG path for [`plot_redundancy`][hf_headattn.methods.sea.analysis.plot_redundancy].

    Returns
    -------
    :
        dict, see [`count_redundant_heads`][hf_headattn.methods.sea.analysis.count_redundant_heads], plus the SEA
        settings under `"settings"`.
    """
    was_training = model.training
    model.eval()
    keep = ("input_ids", "attention_mask", *method_inputs())

    def readouts():
        for batch in batches:
            inputs = {k: v.to(model.device) for k, v in batch.items() if k in keep and v is not None}
            start = torch.full((inputs["input_ids"].shape[0], 1), model.config.decoder_start_token_id,
                               dtype=torch.long, device=model.device)
            yield getattr(model(**inputs, decoder_input_ids=start, **{FLAG: True}), FIELD)

    try:
        report = count_redundant_heads(readouts())
    finally:
        model.train(was_training)
    report["settings"] = getattr(model.config, METHOD.name)
    if plot_path is not None:
        plot_redundancy(report, plot_path)
    return report


def plot_redundancy(report: dict, path: str | Path, title: str = "") -> Path:
    """A bar plot of each head's redundancy frequency, one group of bars per module (matplotlib, Agg backend)."""
    plt = pyplot()

    modules = report["modules"]
    if not modules:
        raise ValueError("the report holds no modules to plot")
    num_heads = max(len(m["redundant_frequency"]) for m in modules.values())
    width = 0.8 / len(modules)
    fig, ax = plt.subplots(figsize=(1.5 + 0.7 * num_heads, 3.5))
    for index, (name, module) in enumerate(modules.items()):
        frequency = module["redundant_frequency"]
        ax.bar([h + index * width for h in range(len(frequency))], frequency, width=width, label=name)
    ax.set_xticks([h + 0.4 - width / 2 for h in range(num_heads)], [f"head {h}" for h in range(num_heads)])
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of sentences redundant")
    ax.set_title(title or f"RHE redundant heads over {report['sentences']} sentences")
    ax.legend(fontsize="small")
    return save_figure(fig, path)
