"""PEFT (LoRA) for models with methods on: the methods' own parameters train and save with the adapter."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from ..attention import AttentionMethod
from ..hf_compat import INPUT_PROJECTIONS, OUTPUT_PROJECTION

DEFAULT_TARGETS = (*INPUT_PROJECTIONS, OUTPUT_PROJECTION)
"""LoRA's default targets: every attention module's projections."""


def method_modules_to_save(model: nn.Module) -> list[str]:
    """Names (as PEFT's `modules_to_save` matches them) of the attached methods that have parameters."""
    names = set()
    for path, module in model.named_modules():
        if isinstance(module, AttentionMethod) and any(True for _ in module.parameters()):
            names.add(path.rsplit(".", 1)[-1])
    return sorted(names)


def lora_config(model: nn.Module, target_modules: Sequence[str] = DEFAULT_TARGETS, **lora_kwargs):
    """A `peft.LoraConfig` for a HeadAttn model: LoRA on `target_modules`, and the methods' new parameters
    (DHICM's W/U/V, LPEA's embeddings, ...) fully trained and saved via `modules_to_save`.

    Raises `ValueError` naming any target that matches no `nn.Linear` of the model, with the names that do.
    """
    from peft import LoraConfig, TaskType

    linear_names = {path.rsplit(".", 1)[-1] for path, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = sorted(set(target_modules) - linear_names)
    if missing:
        raise ValueError(f"LoRA target modules {missing} are not linear layers of this model; "
                         f"expected names from {sorted(linear_names)}")
    to_save = sorted(set(lora_kwargs.pop("modules_to_save", None) or []) | set(method_modules_to_save(model)))
    return LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, target_modules=list(target_modules),
                      modules_to_save=to_save or None, **lora_kwargs)
