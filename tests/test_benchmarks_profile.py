"""``benchmarks/profile_step.py``: a ``torch.profiler`` profile of a training step per row against stock, on the CPU
at the tiny shape (``gpu.sh``'s part ``tb-profile`` runs it at transformer-base on the GPU), and ``gpu_summary.py``
listing that part without judging it."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import gpu_summary  # noqa: E402
import profile_step  # noqa: E402

TOP = 5


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tb-profile.json"
    result = profile_step.main(["--shape", "tiny", "--rows", "off", "dhicm", "--device", "cpu", "--precision", "fp32",
                                "--warmup", "1", "--steps", "1", "--top", str(TOP), "--out", str(out)])
    return out, result


def descending(entries, key):
    return all(a[key] >= b[key] for a, b in zip(entries, entries[1:]))


@pytest.mark.slow
def test_each_row_has_its_total_and_top_operators(profiled):
    out, result = profiled
    assert json.loads(out.read_text()) == result
    assert list(result["rows"]) == ["stock", "off", "dhicm"]  # stock first: the reference
    assert result["steps"] == 1 and result["top"] == TOP and result["device"] == "cpu"
    for name, row in result["rows"].items():
        assert "error" not in row and row["total_ms"] > 0 and "top_kernels" not in row  # (no kernels on the CPU)
        assert 0 < len(row["top"]) <= TOP and descending(row["top"], "ms")
        assert all(len(entry["name"]) <= profile_step.NAME_CHARS and entry["count"] > 0 for entry in row["top"])
    dhicm = result["rows"]["dhicm"]
    assert dhicm["over_stock_ms"] == pytest.approx(dhicm["total_ms"] - result["rows"]["stock"]["total_ms"], abs=1e-3)
    assert 0 < len(dhicm["extra"]) <= TOP and descending(dhicm["extra"], "ms_over_stock")
    assert all(entry["ms_over_stock"] > 0 for entry in dhicm["extra"])
    assert "extra" not in result["rows"]["stock"]


@pytest.mark.slow
def test_gpu_summary_lists_the_profile_part_without_judging_it(profiled, tmp_path):
    out, _ = profiled
    (tmp_path / "tb-profile.json").write_text(out.read_text())
    (tmp_path / "parts.tsv").write_text("\t".join(["tb-profile", "ok", "9", "tiny", "profile", "autocast-bf16",
                                                   "off dhicm"]) + "\n")
    summary = gpu_summary.summarize(tmp_path)
    assert summary["parts"]["tb-profile"]["status"] == "ok"
    assert summary["targets"]["checks"] == [] and summary["table"] == []
    assert "part tb-profile: ok" in gpu_summary.summary_table(summary)


def test_gpu_script_runs_the_profile_part_after_tb_compiled():
    script = (ROOT / "benchmarks" / "gpu.sh").read_text()
    order = [script.index(line) for line in ("\ntiming tb-compiled ", "\npart tb-profile ", "\ntiming tb-bf16 ")]
    assert order == sorted(order) and "benchmarks/profile_step.py" in script


@pytest.mark.slow
def test_a_compiled_profile_compiles_stock_and_each_row():
    """``--compile``: stock and the row profiled as ``torch.compile(model)`` (``aot_eager`` here), each compiled after
    a reset (one graph each)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    counters.clear()
    result = profile_step.run("tiny", ["dhicm"], "cpu", "fp32", 1, 1, TOP, compile_backend="aot_eager")
    assert result["compile"] == "aot_eager" and list(result["rows"]) == ["stock", "dhicm"]
    assert all("error" not in row and row["total_ms"] > 0 for row in result["rows"].values())
    assert counters["stats"]["unique_graphs"] == 2  # one graph a model: stock's and DHICM's
    assert sum(counters["graph_break"].values()) == 0
    assert "compiled (aot_eager)" in profile_step.table(result)
    torch._dynamo.reset()
