"""2-process CPU DDP and FSDP (torchrun, gloo) give the loss, loss components and gradients of one process."""

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


def launch(command, out):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(Path(out).read_text())


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
