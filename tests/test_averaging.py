"""Checkpoint averaging: known means (constant and random weights), step order, loadable output, bad input."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

import hf_headattn
from conftest import TINY
from hf_headattn.commands import average as recipe
from hf_headattn.experiment.averaging import average_checkpoints, last_checkpoints


def save_checkpoint(path, fill=None, seed=0, dtype=torch.float32, **config):
    """A tiny HeadAttn Marian checkpoint; every floating-point tensor set to ``fill`` if given."""
    torch.manual_seed(seed)
    model = hf_headattn.HeadAttnMarianMTModel(hf_headattn.HeadAttnMarianConfig(**{**TINY, **config})).to(dtype)
    if fill is not None:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.fill_(fill)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """checkpoint-50 (weights 100), -200 (1), -300 (2), -1000 (3): by name order -1000 would come first."""
    run = tmp_path_factory.mktemp("run")
    for step, fill in [(50, 100.0), (200, 1.0), (300, 2.0), (1000, 3.0)]:
        save_checkpoint(run / f"checkpoint-{step}", fill=fill)
    (run / "checkpoint-1000" / "source.spm").write_bytes(b"tokenizer model")
    (run / "checkpoint-1000" / "optimizer.pt").write_bytes(b"optimizer state")
    (run / "not-a-checkpoint").mkdir()
    return run


def test_last_checkpoints_are_ordered_by_step(run_dir):
    assert [path.name for path in last_checkpoints(run_dir, 3)] == ["checkpoint-200", "checkpoint-300",
                                                                      "checkpoint-1000"]
    assert [path.name for path in last_checkpoints(run_dir, 1)] == ["checkpoint-1000"]


def test_average_of_weights_1_2_3_is_2_and_loads(run_dir, tmp_path):
    average_checkpoints(last_checkpoints(run_dir, 3), tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved and all(torch.all(tensor == 2.0) for tensor in saved.values() if tensor.is_floating_point())
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert type(model).__name__ == "HeadAttnMarianMTModel"
    assert torch.all(model.lm_head.weight == 2.0) and torch.all(model.model.encoder.layers[1].fc2.weight == 2.0)
    assert (tmp_path / "source.spm").read_bytes() == b"tokenizer model"  # tokenizer files of the last checkpoint
    assert not (tmp_path / "optimizer.pt").exists()  # training state is not copied
    sources = json.loads((tmp_path / "averaged_from.json").read_text())["checkpoints"]
    assert [Path(path).name for path in sources] == ["checkpoint-200", "checkpoint-300", "checkpoint-1000"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_average_of_random_checkpoints_equals_their_mean(tmp_path, dtype):
    paths = [save_checkpoint(tmp_path / f"c{seed}", seed=seed, dtype=dtype) for seed in range(3)]
    average_checkpoints(paths, tmp_path / "avg")
    files = [load_file(path / "model.safetensors") for path in paths]
    averaged = load_file(tmp_path / "avg" / "model.safetensors")
    assert set(averaged) == set(files[0])
    for name, tensor in averaged.items():
        expected = torch.stack([f[name].double() for f in files]).mean(0).to(dtype)
        assert tensor.dtype == dtype and torch.equal(tensor, expected), name
    assert not torch.equal(averaged["model.shared.weight"], files[0]["model.shared.weight"])


def test_more_checkpoints_than_exist_or_none(run_dir, tmp_path):
    with pytest.raises(ValueError, match=r"last 5 checkpoints, but .* has 4: checkpoint-50, checkpoint-200, "):
        last_checkpoints(run_dir, 5)
    with pytest.raises(ValueError, match="positive integer, got 0"):
        last_checkpoints(run_dir, 0)
    with pytest.raises(ValueError, match="has 0: none"):
        last_checkpoints(tmp_path, 1)
    with pytest.raises(ValueError, match="no checkpoints to average"):
        average_checkpoints([], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        average_checkpoints([tmp_path / "nowhere"], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="not-a-checkpoint has no config.json"):
        average_checkpoints([run_dir / "not-a-checkpoint"], tmp_path / "out")
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text((run_dir / "checkpoint-50" / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="config-only has no model.safetensors"):
        average_checkpoints([tmp_path / "config-only"], tmp_path / "out")


def test_different_architectures_name_the_field_or_tensor(tmp_path):
    small = save_checkpoint(tmp_path / "small", encoder_ffn_dim=32)
    large = save_checkpoint(tmp_path / "large", encoder_ffn_dim=64)
    with pytest.raises(ValueError, match=r"config field 'encoder_ffn_dim' is 32 in .*small but 64 in .*large"):
        average_checkpoints([small, large], tmp_path / "out")
    (large / "config.json").write_text((small / "config.json").read_text())  # same config, other tensors
    with pytest.raises(ValueError, match=r"tensor 'model.encoder.layers.0.fc1.bias' has shape \(32,\) in .*small "
                                         r"but \(64,\) in .*large"):
        average_checkpoints([small, large], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_recipe_averages_the_last_n_or_a_list(run_dir, tmp_path, capsys):
    result = recipe.main(["--run_dir", str(run_dir), "--last", "2", "--output_dir", str(tmp_path / "a")])
    assert [Path(path).name for path in result["checkpoints"]] == ["checkpoint-300", "checkpoint-1000"]
    assert torch.all(load_file(tmp_path / "a" / "model.safetensors")["model.shared.weight"] == 2.5)
    listed = [str(run_dir / "checkpoint-50"), str(run_dir / "checkpoint-200")]
    recipe.main(["--checkpoints", *listed, "--output_dir", str(tmp_path / "b")])
    assert torch.all(load_file(tmp_path / "b" / "model.safetensors")["model.shared.weight"] == 50.5)
    with pytest.raises(SystemExit) as stop:  # a usage error
        recipe.main(["--run_dir", str(run_dir), "--checkpoints", *listed, "--output_dir", str(tmp_path / "c")])
    assert stop.value.code == 2 and "either --run_dir (with --last N) or --checkpoints" in capsys.readouterr().err


def test_deepspeed_checkpoints_and_zero3_processes(run_dir, tmp_path, monkeypatch):
    """A DeepSpeed checkpoint saved without gathered weights (no model.safetensors, DeepSpeed's script beside its
    states) is refused naming the script; DeepSpeed's files are not copied; in a process with a ZeRO-3 config
    (``from_pretrained`` would build a partitioned model) averaging is refused before any loading."""
    from hf_headattn.experiment import averaging

    run = tmp_path / "run"
    for step, fill in [(1, 1.0), (2, 3.0)]:
        folder = save_checkpoint(run / f"checkpoint-{step}", fill=fill)
        for name in ("latest", "zero_to_fp32.py", "zero_to_torch.py"):
            (folder / name).write_text("deepspeed")
        (folder / f"global_step{step}").mkdir()
    average_checkpoints(last_checkpoints(run, 2), tmp_path / "averaged")
    assert not {"latest", "zero_to_fp32.py", "zero_to_torch.py", "global_step2"} & {
        path.name for path in (tmp_path / "averaged").iterdir()}
    monkeypatch.setattr(averaging, "zero3_enabled", lambda: True)
    with pytest.raises(ValueError, match=r"average_checkpoints: a DeepSpeed ZeRO-3 config is alive in this process"):
        average_checkpoints(last_checkpoints(run, 2), tmp_path / "refused")
    monkeypatch.undo()
    (run / "checkpoint-1" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"checkpoint-1 holds DeepSpeed's partitioned states but no "
                                                r"model.safetensors: .* python \S+/checkpoint-1/zero_to_fp32.py "
                                                r"\S+/checkpoint-1 \S+/checkpoint-1 \(pytorch_model.bin\)"):
        average_checkpoints(last_checkpoints(run, 2), tmp_path / "ungathered")
