"""DeepSpeed ZeRO-2 and ZeRO-3 through HeadAttnSeq2SeqTrainer on the CPU (torchrun, gloo, two processes).

One launch per stage (``tests/scripts/deepspeed_train.py``) trains DHICM, EaDRA, SEA (DEA+RHE) and the three together
(a model built with heads pruned) in turn, three steps each, against the same runs in one process with the same global
batch, computed here: the loss curves, the saved weights (ZeRO-3: gathered) and what the saved model generates agree,
and so does the average of the last checkpoints. The ZeRO-3 launch then calls every tool that reads method weights
outside the training forward on the partitioned model, on every process: the read-outs give the one-process results,
and what would cut or save the shards refuses with a clear error.
"""

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_headattn import HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.averaging import average_checkpoints, last_checkpoints

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                       reason="DeepSpeed is not installed (the dev extra installs it: pip install -e '.[dev]')"),
]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "deepspeed_train.py"
#: The read-outs that run the model's forward, which gathers the weights on every process.
READOUTS = ("mean_head_importance", "sentence_head_importance", "encoder_attention_entropy", "redundancy_report",
            "score_heads", "generate")
#: The refusals on a ZeRO-3 model: ``{tool: message pattern}``.
REFUSALS = {
    "save_pretrained": r"ValueError: save_pretrained: the model's weights are partitioned by DeepSpeed ZeRO-3 "
                       r"\(model\.shared\.weight holds only this process's shard\), so it would save empty tensors; "
                       r"nothing was written\. Save with trainer\.save_model\(output_dir\)",
    "prune_heads": r"ValueError: prune_heads: the model's weights are partitioned by DeepSpeed ZeRO-3 .*nothing was "
                   r"pruned\. Prune the full weights: save the model \(trainer\.save_model with "
                   r"stage3_gather_16bit_weights_on_model_save: true",
    "average_checkpoints": r"ValueError: average_checkpoints: a DeepSpeed ZeRO-3 config is alive in this process",
}


def load_script():
    spec = importlib.util.spec_from_file_location("deepspeed_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = load_script()


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """(folder, results) of the one-process runs (which write the initial checkpoints the launches start from)."""
    folder = tmp_path_factory.mktemp("deepspeed")
    TRAIN.main(folder / "single.json", 0)
    return folder, json.loads((folder / "single.json").read_text())


def launch(folder: Path, stage: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = folder / f"zero{stage}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    command = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_port", str(port),
               str(SCRIPT), str(out), str(stage)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def check_state_dicts(model, expected, **tolerance) -> None:
    state = model.state_dict()
    assert state.keys() == expected.state_dict().keys()
    for name, value in expected.state_dict().items():
        torch.testing.assert_close(state[name], value, msg=name, **tolerance)


def check_training(folder: Path, single: dict, zero: dict) -> None:
    """Every method's loss curve, saved weights and generated tokens are the one-process run's; so is the average of
    the ``all`` run's last two checkpoints, and DeepSpeed's files stay out of it."""
    assert zero["world_size"] == 2 and single["world_size"] == 1
    for method, expected in single["methods"].items():
        run = zero["methods"][method]
        assert len(run["curve"]) == len(expected["curve"]) == TRAIN.STEPS
        for step, (got, want) in enumerate(zip(run["curve"], expected["curve"])):
            assert got.keys() == want.keys()
            for key, value in want.items():
                # loss and grad norm as computed; the components as the trainer logs them, to 4 decimals
                tolerance = {"rel": 1e-5} if key in ("loss", "grad_norm") else {"abs": 1.1e-4}
                assert got[key] == pytest.approx(value, **tolerance), (method, step, key)
        assert run["curve"][-1]["loss"] < run["curve"][0]["loss"] - 0.1, method  # (it trains)
        reference = HeadAttnMBartForConditionalGeneration.from_pretrained(Path(expected["output_dir"]) / "model")
        model = HeadAttnMBartForConditionalGeneration.from_pretrained(Path(run["output_dir"]) / "model")
        assert (model.config.pruned_heads or {}) == (TRAIN.PRUNED if method == "all" else {})
        check_state_dicts(model, reference, atol=1e-6, rtol=1e-4)
        source = {key: value for key, value in TRAIN.batches(method)[0].items() if key != "labels"}
        tokens = model.generate(**source, max_new_tokens=4, num_beams=2, do_sample=False)
        assert torch.equal(tokens, reference.generate(**source, max_new_tokens=4, num_beams=2, do_sample=False))
    run_dir = Path(zero["methods"]["all"]["output_dir"])
    averaged = average_checkpoints(last_checkpoints(run_dir, 2), folder / f"{run_dir.name}-averaged")
    # (the one-process run averaged its last two checkpoints among its tools)
    reference = HeadAttnMBartForConditionalGeneration.from_pretrained(single["tools"]["average_checkpoints"]["ok"])
    check_state_dicts(averaged, reference, atol=1e-6, rtol=1e-4)
    files = {path.name for path in (folder / f"{run_dir.name}-averaged").iterdir()}
    assert {"latest", "zero_to_fp32.py", "zero_to_torch.py"} & files == set() and not any(
        name.startswith("global_step") for name in files)


def test_deepspeed_zero2_trains_every_method_as_one_process(single):
    folder, results = single
    check_training(folder, results, launch(folder, 2))


def flat(value, path=""):
    """``[(path, number)]`` of a nested JSON value (dicts by key)."""
    if isinstance(value, dict):
        return [item for key in sorted(value) for item in flat(value[key], f"{path}/{key}")]
    if isinstance(value, list):
        return [item for i, entry in enumerate(value) for item in flat(entry, f"{path}/{i}")]
    return [(path, float(value))]


def test_deepspeed_zero3_trains_every_method_as_one_process_and_its_tools_work_or_refuse(single):
    """ZeRO-3 as ZeRO-2 (the ``all`` model built pruned and partitioned from its checkpoint), then the tools on the
    partitioned model: its read-outs and ``generate`` give the one-process results; ``save_pretrained``,
    ``prune_heads`` and ``average_checkpoints`` (in a process where ZeRO-3 is on) refuse, naming the way to full
    weights. A checkpoint saved without gathered weights is refused by the averaging with DeepSpeed's way to them."""
    folder, results = single
    zero = launch(folder, 3)
    check_training(folder, results, zero)
    expected, tools = results["tools"], zero["tools"]
    assert expected["partitioned"] == {"ok": None} and tools["partitioned"] == {"ok": "model.shared.weight"}
    for name in READOUTS:
        assert "ok" in tools[name], tools[name]
        got, want = flat(tools[name]["ok"]), flat(expected[name]["ok"])
        assert [path for path, _ in got] == [path for path, _ in want], name
        torch.testing.assert_close(torch.tensor([v for _, v in got]), torch.tensor([v for _, v in want]), atol=1e-5,
                                   rtol=1e-4, equal_nan=True, msg=name)
    for name, pattern in REFUSALS.items():
        assert "ok" in expected[name], expected[name]
        assert re.match(pattern, tools[name].get("error", "")), tools[name]
    assert not (folder / "zero3-tools").exists()  # nothing written

    ungathered = folder / "ungathered"
    for checkpoint in last_checkpoints(Path(zero["methods"]["all"]["output_dir"]), 2):
        shutil.copytree(checkpoint, ungathered / checkpoint.name, ignore=shutil.ignore_patterns("model.safetensors"))
    message = (r"ungathered/checkpoint-2 holds DeepSpeed's partitioned states but no model\.safetensors: the run did "
               r"not gather the weights .* python \S+/checkpoint-2/zero_to_fp32\.py \S+/checkpoint-2 \S+/checkpoint-2 "
               r"\(pytorch_model\.bin\), then as safetensors")
    with pytest.raises(FileNotFoundError, match=message):
        average_checkpoints(last_checkpoints(ungathered, 2), folder / "never")
