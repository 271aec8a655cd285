"""A model card (the Hub's README.md) that records the methods, their settings and the scores."""

from __future__ import annotations

import json
from pathlib import Path

from ..registry import active_methods
from .kit import kit_of

TEMPLATE = """---
library_name: transformers
tags: [translation, hf-headattn{tags}]
---
# {name}

A {model_type} translation model trained with [hf-headattn](https://pypi.org/project/hf-headattn/).

## Methods
{methods}

## Settings
```json
{settings}
```

## Scores
{scores}

## Loading
With the package installed (safer: no code from the checkpoint runs): `import hf_headattn` and then
`AutoModelForSeq2SeqLM.from_pretrained("{name}")`. Without it: `from_pretrained("{name}", trust_remote_code=True)`
runs the modeling code stored beside the weights; read it first.
"""


def method_settings_of(config) -> dict:
    """The config's method settings and loss settings that differ from the defaults (`{}`: a stock model, whose
    config has neither)."""
    settings = {spec.name: getattr(config, spec.name) for spec in active_methods(config)}
    if getattr(config, "label_smoothing", None):
        settings["label_smoothing"] = config.label_smoothing
    return settings


def write_model_card(model, output_dir: str | Path, name: str, scores: dict | None = None) -> Path:
    """Write `README.md` for `model` into `output_dir`; `scores` maps test sets to metric dicts
    (e.g. `hf_headattn.experiment.evaluation.compute_translation_metrics` results)."""
    settings = method_settings_of(model.config)
    active = active_methods(model.config)
    methods = "\n".join(f"- **{spec.name}**: {kit_of(spec).paper}" for spec in active)
    methods = methods or "- none (the stock architecture)"
    rows = ["| test set | BLEU | chrF | signature |", "|---|---|---|---|"]
    for test_set, metrics in (scores or {}).items():
        rows.append(f"| {test_set} | {metrics['bleu']:.2f} | {metrics['chrf']:.2f} | "
                    f"`{metrics.get('bleu_signature', '')}` |")
    text = TEMPLATE.format(
        name=name, model_type=model.config.model_type,
        tags="".join(f", {spec.name}" for spec in active), methods=methods,
        settings=json.dumps(settings, indent=2), scores="\n".join(rows) if scores else "not evaluated yet",
    )
    path = Path(output_dir) / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
