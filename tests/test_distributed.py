"""2-process CPU DDP and FSDP (torchrun, gloo) give the loss, loss components and gradients of one process; the
README's launch line (``torchrun --nproc_per_node 2 -m hf_headattn train ...``) trains as DDP on the CPU without extra
flags, scores each sentence once, and one process writes."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "ddp_train.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(command, out=None, **env):
    """Run ``command`` (our package first on the path); the JSON it wrote to ``out``, or its output (``out`` None)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **env}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout if out is None else json.loads(Path(out).read_text())


@pytest.mark.slow
def test_two_process_ddp_equals_one_process(tmp_path):
    single = launch([sys.executable, str(SCRIPT), str(tmp_path / "single.json"), "8"], tmp_path / "single.json")
    torchrun = Path(sys.executable).with_name("torchrun")
    ddp = launch([str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()), str(SCRIPT),
                  str(tmp_path / "ddp.json"), "4"], tmp_path / "ddp.json")
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    for key in ("loss", "nll_loss", "dhicm_kl", "grad_norm"):
        assert ddp["logged"][key] == pytest.approx(single["logged"][key], rel=1e-3), key
    assert single["grads"].keys() == ddp["grads"].keys()
    for name, grad in single["grads"].items():
        torch.testing.assert_close(torch.tensor(ddp["grads"][name]), torch.tensor(grad), atol=1e-6, rtol=1e-4,
                                   msg=name)


@pytest.mark.slow
@pytest.mark.lowest_only  # accelerate's and torch's FSDP; the Trainer's DDP and the README's launch run on both ends
def test_two_process_fsdp_with_every_method_equals_one_process(tmp_path):
    """FSDP2 shards on the CPU (gloo) with DHICM, EaDRA and LPEA+RHE on; regression test: the per-forward context
    was a dataclass holding a defaultdict, which fully_shard tried to rebuild (TypeError) between layers."""
    script = SCRIPT.with_name("fsdp_train.py")
    single = launch([sys.executable, str(script), str(tmp_path / "single.json")], tmp_path / "single.json")
    torchrun = Path(sys.executable).with_name("torchrun")
    fsdp = launch([str(torchrun), "--nproc_per_node", "2", "--master_port", str(free_port()), str(script),
                   str(tmp_path / "fsdp.json")], tmp_path / "fsdp.json")
    assert fsdp["world_size"] == 2 and single["world_size"] == 1 and fsdp["sharded"].startswith("FSDP")
    for key in ("loss", "nll_loss", "dhicm_kl", "eadra_loss"):
        assert fsdp["logged"][key] == pytest.approx(single["logged"][key], rel=1e-4, abs=1e-6), key
    assert single["grads"].keys() == fsdp["grads"].keys()
    assert any("lpea" in name for name in single["grads"]) and any("dhicm" in name for name in single["grads"])
    for what in ("grads", "params"):
        for name, value in single[what].items():
            torch.testing.assert_close(torch.tensor(fsdp[what][name]), torch.tensor(value), atol=1e-6, rtol=1e-4,
                                       msg=f"{what} {name}")


def test_resuming_with_another_world_size_is_refused(tmp_path):
    from types import SimpleNamespace

    from hf_headattn.experiment.trainer import check_resume_world_size

    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    for rank in range(2):
        (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"")
    check_resume_world_size(checkpoint, SimpleNamespace(world_size=2, output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"checkpoint-10 was written by 2 process\(es\) but this run has world_size=1"):
        check_resume_world_size(True, SimpleNamespace(world_size=1, output_dir=str(tmp_path)))


@pytest.mark.slow
def test_the_readme_launch_line_trains_as_ddp_on_the_cpu_scores_each_sentence_once_and_one_process_writes(
        tmp_path, multi30k, multi30k_lines):
    """``torchrun --nproc_per_node 2 -m hf_headattn train ...`` as the README writes it (no --use_cpu/--ddp_backend),
    on real Multi30k lines: one training of two processes (one RNG state each in the checkpoint; 2 steps of 2 x 8
    pairs are half an epoch of 64), and an evaluation split of 4 sentences, smaller than the processes' batches (2 x
    8), scored once each, in order."""
    from hf_headattn import translate
    from hf_headattn.experiment.evaluation import compute_translation_metrics
    from hf_headattn.experiment.tokenization import load_tokenizer
    from hf_headattn.modeling import HeadAttnMarianMTModel

    out = tmp_path / "run"
    flags = ["--model_shape", "tiny", "--output_dir", str(out), "--max_train_samples", "64", "--max_eval_samples", "4",
             "--test_splits", "validation", "--vocab_size", "300", "--max_steps", "2", "--save_steps", "2",
             "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--num_beams", "2",
             "--max_target_length", "16", "--report_to", "none", "--learning_rate", "1e-3"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_port",
                str(free_port())]
    stdout = launch([*torchrun, "-m", "hf_headattn", "train", *flags], HF_HEADATTN_DATA=str(multi30k))
    assert sorted(path.name for path in (out / "checkpoint-2").glob("rng_state*")) == ["rng_state_0.pth",
                                                                                      "rng_state_1.pth"]
    results = json.loads((out / "results.json").read_text())
    assert results["epochs"] == 0.5 and results["global_step"] == 2 and stdout.count("results written to") == 1
    predictions = (out / "predictions_validation.txt").read_text(encoding="utf-8").splitlines()
    scores = compute_translation_metrics(predictions, multi30k_lines("val", "de", 4))
    assert results["scores"]["validation"] == scores and len(predictions) == 4
    model, tokenizer = HeadAttnMarianMTModel.from_pretrained(out), load_tokenizer(out)
    assert results["num_parameters"] == model.num_parameters()
    sources = multi30k_lines("val", "en", 4)
    assert predictions == [translate(model, tokenizer, [source], num_beams=2, max_length=16)[0] for source in sources]


def test_a_multi_process_launch_on_the_cpu_defaults_to_ddp_over_gloo_and_one_that_trains_apart_is_refused(
        monkeypatch):
    from types import SimpleNamespace

    from transformers import HfArgumentParser, Seq2SeqTrainingArguments
    from transformers.training_args import ParallelMode

    from hf_headattn.experiment import launch as launching

    def defaults(argv=()):
        parser = HfArgumentParser(Seq2SeqTrainingArguments)
        launching.cpu_launch_defaults(parser)
        namespace, _ = parser.parse_known_args(["--output_dir", "out", *argv])
        return namespace.use_cpu, namespace.ddp_backend

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert defaults() == (False, None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(launching, "without_accelerator", lambda: False)  # GPUs: the Trainer's own defaults
    assert defaults() == (False, None)
    monkeypatch.setattr(launching, "without_accelerator", lambda: True)
    assert defaults() == (True, "gloo") and defaults(["--use_cpu", "false", "--ddp_backend", "mpi"]) == (False, "mpi")
    def args(mode, world_size):
        return SimpleNamespace(parallel_mode=ParallelMode(mode), world_size=world_size, device="cpu")

    launching.check_launch(args("distributed", 2))
    # --use_cpu false: each process alone; with --ddp_backend gloo they even count each other, yet train apart
    for mode, world_size in (("not_parallel", 1), ("not_parallel", 2), ("distributed", 1)):
        with pytest.raises(ValueError, match=r"the launcher started 2 processes \(WORLD_SIZE=2\), but the training "
                           rf"arguments train each on its own \(parallel mode '{mode}', world_size={world_size}, on "
                           r"cpu\).*expected --use_cpu true --ddp_backend gloo"):
            launching.check_launch(args(mode, world_size))
    monkeypatch.setenv("WORLD_SIZE", "1")
    launching.check_launch(args("not_parallel", 1))


def test_ending_waits_for_every_process_then_leaves_the_group(tmp_path, monkeypatch):
    """end_processes: a barrier (the gloo workers' last drops before interpreter shutdown; see its docstring), then
    the group destroyed; a no-op outside a group."""
    from hf_headattn.experiment.launch import end_processes

    dist = torch.distributed
    calls = []

    def spy(name):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *args, **kwargs: calls.append(name) or real(*args, **kwargs))

    spy("barrier")
    spy("destroy_process_group")
    end_processes()
    assert calls == [] and not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        end_processes()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert calls == ["barrier", "destroy_process_group"] and not dist.is_initialized()


@pytest.mark.parametrize("command", ["train", "finetune"])
def test_resuming_a_two_process_checkpoint_in_one_process_is_a_usage_error(tmp_path, capsys, command):
    from hf_headattn import cli

    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    for rank in range(2):
        (checkpoint / f"rng_state_{rank}.pth").write_bytes(b"")
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--output_dir", str(tmp_path), "--resume_from_checkpoint", "true", "--use_cpu", "true"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"error: {checkpoint} was written by 2 process(es) but this run has world_size=1; resume with 2" in err
