"""Tiny random models (vocab 99, d_model 16, 2+2 layers, 4 heads) saved as stock HF checkpoints."""

import pytest
import torch
from transformers import MarianConfig, MarianMTModel, MBartConfig, MBartForConditionalGeneration

import hf_headattn

TINY = dict(
    vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=0, forced_eos_token_id=None,
)

FAMILIES = {
    "mbart": (MBartConfig, MBartForConditionalGeneration, hf_headattn.HeadAttnMBartForConditionalGeneration),
    "marian": (MarianConfig, MarianMTModel, hf_headattn.HeadAttnMarianMTModel),
}


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def stock_checkpoint(request, tmp_path_factory):
    """(family, path) of a saved stock checkpoint with random weights."""
    config_cls, model_cls, _ = FAMILIES[request.param]
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY))
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    return request.param, path


def batch():
    """Source and labels with padding in the second row (pad id 1, eos 2)."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 1, 1]])
    labels = torch.tensor([[13, 14, 15, 2], [16, 2, -100, -100]])
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(1).long(), "labels": labels}


def syntax_batch():
    """:func:`batch` with SEA's inputs: each token related to its neighbours (``dependency_mask``) and relative
    phrase positions clipped to [-2, 2] (``phrase_positions``)."""
    inputs = batch()
    B, S = inputs["input_ids"].shape
    near = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).abs() <= 1
    inputs["dependency_mask"] = near.expand(B, S, S)
    inputs["phrase_positions"] = (torch.arange(S)[None, :] - torch.arange(S)[:, None]).clamp(-2, 2).expand(B, S, S)
    return inputs


#: What ``slow`` marks (``pytest -m "not slow"``, the quick loop, leaves them out; ``make test`` runs everything): the
#: test modules that train with the Trainer, start processes, execute notebooks or compile with Inductor, and the
#: single tests of other modules that do so.
SLOW_MODULES = {
    "test_compile", "test_converged_study", "test_distributed", "test_fidelity_study", "test_fused_passes",
    "test_gpu_script", "test_long_run", "test_notebooks", "test_overhead", "test_prune_heads_recipe",
    "test_recipe_finetune_mbart", "test_recipes", "test_search", "test_benchmarks_profile", "test_eadra_triton",
}
SLOW_TESTS = {
    "test_syntax_parser_is_recorded_saved_and_used_by_function_and_cli", "test_import_does_not_load_the_experiment_kit",
    "test_the_stand_in_config_reads_through_and_backends_are_checked", "test_pruned_marian_and_remote_code",
    "test_remote_code_loads_without_the_package_with_same_outputs",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = getattr(item, "module", None)
        if (module is not None and module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES) or \
                getattr(item, "originalname", None) in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
