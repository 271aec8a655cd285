"""``benchmarks/overhead.py``'s precision, ``--compile`` and ``generate`` timing, the compile check
(``benchmarks/compile_check.py``) and ``benchmarks/gpu.sh``'s summary, on the CPU at the tiny shapes (the GPU runs
``gpu.sh``; ``SMOKE=1 bash benchmarks/gpu.sh`` runs all of it on the CPU in minutes)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

import gpu_summary  # noqa: E402
import overhead  # noqa: E402


@pytest.mark.slow
def test_gpu_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu.sh")], check=True)


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "bf16", "--precision", "fp32"], "--dtype bf16 contradicts --precision fp32"),
    (["--compile", "--compile-backend", "no-such-backend"], "--compile-backend 'no-such-backend'"),
    (["--compile", "--warmup", "0"], "--warmup 0: at least 1 with --compile"),
    (["--repeats", "0"], "--repeats 0: at least 1"),
])
def test_bad_options_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        overhead.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_rows_under_autocast_against_compiled_stock(tmp_path):
    out = tmp_path / "compiled.json"
    result = overhead.main(["--shape", "tiny", "--rows", "off", "--precision", "autocast-bf16", "--compile",
                            "--compile-backend", "aot_eager", "--repeats", "1", "--warmup", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert (result["precision"], result["dtype"], result["autocast"]) == ("autocast-bf16", "torch.float32",
                                                                          "torch.bfloat16")
    assert result["compile"]["backend"] == "aot_eager" and result["compile"]["recompile_limit"] >= 8
    assert result["optimizer"] == "AdamW(foreach=True)" and result["generate"] is None
    assert set(result["rows"]) == {"stock", "off"}
    for row in result["rows"].values():
        compiled = row["compile"]
        assert compiled["graphs"] >= 1 and compiled["graph_breaks"] == 0
        assert compiled["recompiles"] == compiled["settle_graphs"] == 0 and compiled["timed_alone"] is False
        assert row["operators"] is None and row["median_ms"] > 0 and row["peak_gib"] is None
    assert result["rows"]["off"]["time_ratio"] > 0


@pytest.mark.slow
def test_eager_generate_rows():
    # (fp32: bf16 matrix products are slow on most CPUs; the device run uses autocast-bf16 for generate as well)
    result = overhead.main(["--shape", "tiny", "--rows", "off", "--precision", "fp32", "--repeats", "1", "--warmup",
                            "0", "--generate-beams", "2", "--generate-tokens", "3", "--generate-repeats", "1"])
    assert result["generate"] == {"num_beams": 2, "new_tokens": 3, "batch_size": 16, "repeats": 1}
    assert result["rows"]["stock"]["generate_ratio"] == 1.0 and result["rows"]["off"]["generate_ms"] > 0
    assert result["rows"]["off"]["compile"] is None and result["rows"]["off"]["operators"] > 0
    assert result["precision"] == "fp32" and result["autocast"] is None


def test_sdpa_baseline_beside_another_backend_without_counts():
    """``--attn-implementation`` builds stock and the rows on that backend (each row names the one it ran),
    ``--sdpa-baseline`` adds stock on SDPA (not judged), ``--no-count`` counts nothing: what tb-flex runs on flex."""
    result = overhead.main(["--shape", "tiny", "--rows", "off", "--attn-implementation", "eager", "--sdpa-baseline",
                            "--no-count", "--precision", "fp32", "--repeats", "1", "--warmup", "0"])
    rows = result["rows"]
    assert {name: row["attn_implementation"] for name, row in rows.items()} == {
        "stock": "eager", overhead.SDPA_STOCK: "sdpa", "off": "eager"}
    assert rows["stock"]["time_ratio"] == 1.0 and rows[overhead.SDPA_STOCK]["time_ratio"] > 0
    assert all(row[key] is None for row in rows.values() for key in ("operators", "syncs", "generate_operators"))
    assert list(result["targets"]) == ["off"]


@pytest.mark.slow
def test_compile_check_on_the_cpu(tmp_path):
    import compile_check

    out = tmp_path / "check.json"
    result = compile_check.main(["--device", "cpu", "--backend", "aot_eager", "--rows", "all", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    row = result["rows"]["all"]
    assert row["crashed"] is None and len(row["graphs"]) == 3 and row["graph_breaks"] == 0
    assert row["recompiled"] is False and row["equal"] is True and result["ok"] is True
    assert row["grad_max_diff"] <= result["tolerance"] == compile_check.TOLERANCE["fp32"]


def test_fresh_batches_are_padded_and_keep_their_shape():
    from compile_check import TINY, fresh_batch
    from hf_headattn import HeadAttnMBartConfig

    config = HeadAttnMBartConfig(**TINY)
    first, second = fresh_batch(0, config, "cpu", sea=True), fresh_batch(1, config, "cpu", sea=True)
    assert {k: v.shape for k, v in first.items()} == {k: v.shape for k, v in second.items()}
    assert not first["attention_mask"].all() and (first["labels"] == -100).any()
    assert not (first["input_ids"] == second["input_ids"]).all()


def row(median_ms, time_ratio, memory_ratio, compile=None, error=None):
    if error:
        return {"error": error}
    return {"median_ms": median_ms, "time_ratio": time_ratio, "memory_ratio": memory_ratio, "compile": compile}


def test_summary_judges_each_target(tmp_path):
    clean = {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "timed_alone": False}
    parts = {
        "triton-check": ("ok", "stacked", "triton", "fp32+bf16", "triton eager compiled", None),
        "tb-eager": ("ok", "transformer-base", "eager", "autocast-bf16", "off dhicm eadra-scratch", {
            "stock": row(10, 1.0, 1.0), "off": row(10, 1.0, 1.0), "dhicm": row(11, 1.1, 1.01),
            "eadra-scratch": row(11, 1.1, 1.2)}),
        "tb-compiled": ("ok", "transformer-base", "compiled", "autocast-bf16", "off dea-rhe lpea-rhe", {
            "stock": row(5, 1.0, 1.0, clean), "off": row(5, 1.0, 1.0, clean),
            "dea-rhe": row(6, 1.2, 1.0, {**clean, "recompiles": 2}), "lpea-rhe": row(0, 0, 0, error="boom")}),
        "tb-bf16": ("ok", "transformer-base", "eager", "bf16", "off", {"stock": row(8, 1, 1), "off": row(9, 1.1, 1.3)}),
        "mbart-eager": ("timeout after 70 s", "mbart-large-8x512", "eager", "autocast-bf16", "eadra-finetune", None),
        "mbart-no-logits": ("ok", "mbart-large-8x512", "eager", "autocast-bf16", "off off-no-logits", {
            "stock": row(100, 1.0, 1.0), "off": row(100, 1.0, 1.0), "off-no-logits": row(103, 1.03, 0.55)}),
        "compile-check": ("ok", "tiny", "check", "autocast-bf16", "dhicm eadra", {
            "dhicm": {"ok": True, "crashed": None}, "eadra": {"ok": False, "crashed": "InductorError: x"}}),
        "rel-pos-check": ("ok", "transformer-base", "rel-pos-check", "fp32+bf16", "rel-pos-triton", None),
    }
    lines = []
    for name, (status, shape, mode, precision, rows, found) in parts.items():
        lines.append("\t".join([name, status, "12", shape, mode, precision, rows]))
        if found is not None:
            (tmp_path / f"{name}.json").write_text(json.dumps({"device": "cuda", "device_name": "H100", "torch": "2",
                                                               "transformers": "5", "rows": found}))
    (tmp_path / "parts.tsv").write_text("\n".join(lines) + "\n")
    (tmp_path / "triton-check.json").write_text(json.dumps({  # triton_check.py's: no rows, the run's device first
        "ok": True, "device": "cuda", "device_name": "H100", "torch": "2", "errors": {"float32": {"grads": 1e-6}},
        "ms": {"bfloat16": {"triton": 9.7, "compiled": 5.2}}}))
    (tmp_path / "rel-pos-check.json").write_text(json.dumps({  # rel_pos_check.py's: no rows
        "ok": False, "device": "cuda", "errors": {"bfloat16": {"output": {"triton": 0.1, "eager": 0.01}}},
        "ms": {"bfloat16": {"triton": 1.0, "eager": 2.0}}, "triton_over_eager": {"bfloat16": 0.5}}))
    summary = json.loads(json.dumps(gpu_summary.summarize(tmp_path)))
    met = {(c["target"], c["row"], c["part"]): c["met"] for c in summary["targets"]["checks"]}
    assert met[("triton pass equal", "triton", "triton-check")] is True
    assert met[("rel-pos kernels equal", "rel-pos-triton", "rel-pos-check")] is False  # 0.1 > 2 x 0.01
    kernels = next(c for c in summary["targets"]["checks"] if c["target"] == "rel-pos kernels equal")
    assert kernels["measured"]["triton_over_eager"] == {"bfloat16": 0.5}
    assert met[("eager time", "dhicm", "tb-eager")] is False  # 1.10 > 1.05
    why = {(c["target"], c["row"], c["part"]): c.get("why") for c in summary["targets"]["checks"]}
    assert why[("eager time", "dhicm", "tb-eager")] == gpu_summary.WHY["eager time", "dhicm"]  # a known reason
    assert why[("compiled time", "dea-rhe", "tb-compiled")] is None  # over, for no known reason
    assert why[("eager time", "eadra-scratch", "tb-eager")] is None  # met: no reason given
    assert met[("eager time", "eadra-scratch", "tb-eager")] is True and met[("peak memory", "off", "tb-eager")]
    assert met[("peak memory", "eadra-scratch", "tb-eager")] is False
    assert ("eager time", "off", "tb-eager") not in met  # (no time target for "off")
    assert met[("compiled time", "off", "tb-compiled")] is True
    assert met[("compiled time", "dea-rhe", "tb-compiled")] is False
    assert met[("compiles cleanly", "dea-rhe", "tb-compiled")] is False  # recompiled during the timed steps
    assert met[("compiled time", "lpea-rhe", "tb-compiled")] == "not measured: boom"
    assert met[("eager time", "eadra-finetune", "mbart-eager")] == "not measured: part timeout after 70 s"
    assert met[("peak memory", "off-no-logits", "mbart-no-logits")] is True  # 0.55 <= 0.60
    assert met[("time over the logits path", "off-no-logits", "mbart-no-logits")] is True  # 103 / 100 <= 1.05
    assert met[("peak memory", "off", "mbart-no-logits")] is True  # the logits row keeps the GPU target 1.05
    assert met[("compile check", "dhicm", "compile-check")] is True
    assert met[("compile check", "eadra", "compile-check")] is False
    assert not any(c["part"] == "tb-bf16" for c in summary["targets"]["checks"])  # pure bf16: not judged
    assert summary["run"]["judged"] is True and summary["parts"]["mbart-eager"]["status"].startswith("timeout")
    counts = summary["targets"]
    assert counts["met"] + counts["not_met"] + counts["not_measured"] == len(counts["checks"])
    assert {r["part"] for r in summary["table"]} == {"tb-eager", "tb-compiled", "tb-bf16", "mbart-no-logits"}
    text = gpu_summary.summary_table(summary)
    assert "targets:" in text and f"why: {gpu_summary.WHY['eager time', 'dhicm']}" in text


def gpu_plan(plan: str) -> list[dict]:
    """``PLAN_ONLY=1 bash benchmarks/gpu.sh``'s parts of one plan: name, plan, limit_s, shape, mode, precision, rows."""
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh")], cwd=ROOT, check=True, capture_output=True,
                         text=True, env={**os.environ, "PLAN_ONLY": "1", "PLAN": plan, "EXTRA_PARTS": ""}).stdout
    keys = ("name", "plan", "limit_s", "shape", "mode", "precision", "rows")
    parts = [dict(zip(keys, line.split("\t"))) for line in out.splitlines()]
    return [{**p, "limit_s": int(p["limit_s"]), "rows": p["rows"].split()} for p in parts]


def test_every_target_row_comes_first_in_a_plan_under_six_minutes():
    plans = {plan: gpu_plan(plan) for plan in ("1", "2", "3")}
    assert [p["name"] for p in gpu_plan("all")] == [p["name"] for plan in plans.values() for p in plan]
    deadline, start = 340, 10  # gpu.sh's DEADLINE; the start: its import check
    targets = {(row, mode) for _, row, mode in gpu_summary.TARGET_ROWS}
    held = set()  # the target rows of the parts so far, plan after plan
    for plan, parts in plans.items():
        first = []  # the parts that add a target row: before any other part of the plan
        for part in parts:
            judged = {(row, part["mode"]) for row in part["rows"] if part["precision"] == "autocast-bf16"}
            if judged & targets - held:
                assert len(first) == parts.index(part), f"PLAN={plan}: {part['name']} after an untargeted part"
                first.append(part)
                held |= judged & targets
        assert sum(p["limit_s"] for p in first) + start <= deadline < 360, f"PLAN={plan}: {first}"
    assert held == targets
    issue_table = {("dhicm", "eager"), ("dhicm", "compiled"), ("eadra-scratch", "eager"), ("eadra-scratch", "compiled"),
                   ("eadra-finetune", "eager"), ("dhicm-finetune", "eager"), ("lpea-rhe", "eager"),
                   ("dea-rhe", "eager"), ("off-no-logits", "eager")}
    assert issue_table <= {(row, p["mode"]) for p in plans["1"] for row in p["rows"]}
    assert sum(p["limit_s"] for p in plans["1"]) + start <= deadline  # PLAN=1 whole


def test_an_absent_target_row_is_not_measured_and_the_readme_table_comes_from_one_run(tmp_path):
    (tmp_path / "parts.tsv").write_text("\t".join(["tb-eager", "ok", "30", "transformer-base", "eager",
                                                   "autocast-bf16", "dhicm off-no-logits"]) + "\n")
    (tmp_path / "tb-eager.json").write_text(json.dumps({"device": "cuda", "device_name": "H100", "torch": "2",
                                                        "transformers": "5", "rows": {
        "stock": row(10, 1.0, 1.0), "dhicm": row(10.5, 1.05, 1.0), "off-no-logits": row(9, 0.9, 0.5)}}))
    summary = gpu_summary.summarize(tmp_path)
    rows = {(r["target"], r["row"], r["mode"]): r["met"] for r in summary["targets"]["rows"]}
    assert len(rows) == len(gpu_summary.TARGET_ROWS)
    assert rows["eager time", "dhicm", "eager"] is True and rows["peak memory", "off-no-logits", "eager"] is True
    assert rows["compiled time", "dhicm", "compiled"] == ("not measured: no compiled part of this run has the row "
                                                          "dhicm (gpu.sh PLAN=1 to 3 do)")
    assert rows["time over the logits path", "off-no-logits", "eager"] == ("not measured: no off row timed in part "
                                                                           "tb-eager")
    assert summary["targets"]["row_counts"] == {"met": 3, "not_met": 0, "not_measured": len(rows) - 3}
    readme = tmp_path / "README.md"
    start, end = gpu_summary.README_MARKERS
    readme.write_text(f"# x\n{start}\nold table\n{end}\nafter\n")
    gpu_summary.main([str(tmp_path), "--readme", str(readme)])
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{end}\nafter\n")
    assert f"From `{tmp_path.as_posix()}` alone" in text
    assert "| DHICM (1.05) | 1.05 | 1.00 | - | - | - |" in text
    readme.write_text("no markers")
    with pytest.raises(SystemExit, match="expected the lines"):
        gpu_summary.main([str(tmp_path), "--readme", str(readme)])


def flex_folder(folder, status="ok", result=None):
    """A gpu.sh RESULTS folder with the one part tb-flex (``result``: its JSON, None: none written)."""
    (folder / "parts.tsv").write_text("\t".join(["tb-flex", status, "40", "transformer-base", "flex",
                                                 "autocast-bf16", "dhicm lpea-rhe"]) + "\n")
    if result is not None:
        (folder / "tb-flex.json").write_text(json.dumps(result))
    return gpu_summary.summarize(folder)


def test_flex_part_on_the_cpu_runs_nothing_and_says_why(tmp_path):
    """``SMOKE=1``'s tb-flex: torch has no flex backward on the CPU, so neither the gradient check nor the timing runs,
    each says so, and the summary reports the check as not measured, for that reason, not as met."""
    import flex_check

    out = tmp_path / "tb-flex.json"
    result = flex_check.main(["--shape", "tiny", "--device", "cpu", "--precision", "autocast-bf16", "--repeats", "1",
                              "--warmup", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    check = result["lpea_gradient"]
    assert (check["ok"], check["status"], check["grad_max_diff"]) == (None, "not run: no flex backward on cpu", {})
    assert result["timing"] == "not run: no flex backward on cpu" and result["rows"] == {}
    summary = flex_folder(tmp_path, result=result)
    (found,) = summary["targets"]["checks"]
    assert (found["target"], found["part"]) == ("flex lpea bias gradient", "tb-flex")
    assert found["met"] == "not measured: not run: no flex backward on cpu"
    assert summary["flex"] == {"tb-flex": {"timing": "not run: no flex backward on cpu"}}
    assert summary["table"] == [] and "flex tb-flex: timing not run" in gpu_summary.summary_table(summary)


def test_lpea_gradient_check_compares_the_bias_gradients_and_catches_a_missing_one(monkeypatch):
    """The check's comparison on the CPU, eager in flex's place: the LPEA gradients agree with SDPA's; with the bias
    detached on the compared backend's forward (what a torch without gradients to score_mod's captured tensors
    gives), the check fails, naming the missing gradients."""
    import torch

    import flex_check
    import hf_headattn.methods.sea.core

    cpu = torch.device("cpu")
    check = flex_check.lpea_gradient("tiny", cpu, "fp32", backend="eager")
    assert check["ok"] is True and check["crashed"] is None and len(check["grad_max_diff"]) == 4
    assert max(check["grad_max_diff"].values()) < 1e-4 and check["loss_diff"] < 1e-5
    bias, calls = hf_headattn.methods.sea.core.lpea_bias, []

    def detached_after_the_first(*args):  # (SEA is on one layer: one call per forward, SDPA's first)
        calls.append(None)
        value, allowed = bias(*args)
        return (value if len(calls) == 1 else value.detach()), allowed

    monkeypatch.setattr(hf_headattn.methods.sea.core, "lpea_bias", detached_after_the_first)
    check = flex_check.lpea_gradient("tiny", cpu, "fp32", backend="eager")
    assert len(calls) == 2 and check["ok"] is False
    assert set(check["grad_max_diff"].values()) == {"no gradient on eager"}


def test_flex_timing_records_why_stock_failed(monkeypatch):
    import torch

    import flex_check

    def compile_error(*args, **kwargs):
        raise RuntimeError("flex kernel failed to compile")

    monkeypatch.setattr(overhead, "run", compile_error)
    assert flex_check.timing("tiny", ["dhicm"], torch.device("cuda"), "autocast-bf16", 1, 1) == {
        "timing": "failed: RuntimeError: flex kernel failed to compile", "rows": {}}


@pytest.mark.parametrize("ok", [True, False])
def test_summary_reports_the_flex_part_and_a_failed_gradient_check(tmp_path, ok):
    rows = {"stock": {**row(40, 1.0, 1.0), "attn_implementation": "flex_attention"},
            "stock-sdpa": {**row(36, 0.9, 0.95), "attn_implementation": "sdpa"},
            "dhicm": {**row(44, 1.1, 1.0), "attn_implementation": "flex_attention"},
            "lpea-rhe": row(0, 0, 0, error="OutOfMemoryError: x")}
    gradient = {"row": "lpea-rhe", "ok": ok, "status": "ran", "tolerance": 0.05, "loss_diff": 1e-4,
                "grad_max_diff": {"lpea_weight": 0.01 if ok else "no gradient on flex_attention"}, "crashed": None}
    summary = flex_folder(tmp_path, result={
        "device": "cuda", "device_name": "H100", "torch": "2", "transformers": "5", "lpea_gradient": gradient,
        "timing": "ran", "rows": rows, "flex_over_sdpa": 1.1111, "over_sdpa": {"stock": 1.1111, "stock-sdpa": 1.0,
                                                                               "dhicm": 1.2222}})
    (found,) = summary["targets"]["checks"]  # the gradient check; the times are not judged
    assert found["met"] is ok and found["limit"] == 0.05
    assert summary["targets"]["rows"] == gpu_summary.target_rows([])  # no target row from the flex part
    flex = summary["flex"]["tb-flex"]
    assert flex["flex_over_sdpa"] == 1.1111 and flex["time_ratio"]["dhicm"] == 1.1
    assert flex["attn_implementation"] == {"stock": "flex_attention", "stock-sdpa": "sdpa", "dhicm": "flex_attention",
                                           "lpea-rhe": None}
    assert flex["errors"] == {"lpea-rhe": "OutOfMemoryError: x"}
    assert {r["row"] for r in summary["table"]} == set(rows)
    text = gpu_summary.summary_table(summary)
    assert "flex tb-flex: stock on flex 1.1111 of stock SDPA's step" in text and "dhicm 1.2222" in text
    assert ("not met: flex lpea bias gradient lpea-rhe (tb-flex)" in text) is not ok


@pytest.mark.parametrize("status", ["timeout after 75 s", "skipped: deadline"])
def test_a_cut_flex_part_is_not_measured_and_an_absent_one_changes_nothing(tmp_path, status):
    summary = flex_folder(tmp_path, status=status)
    (found,) = summary["targets"]["checks"]
    assert found["met"] == f"not measured: part {status}"
    assert summary["flex"] == {"tb-flex": {"timing": f"part {status}"}}
    (tmp_path / "parts.tsv").write_text("")  # a run without the part
    absent = gpu_summary.summarize(tmp_path)
    assert absent["flex"] == {} and absent["targets"]["checks"] == []
    assert "flex" not in gpu_summary.summary_table(absent)


def test_the_readme_gpu_table_is_the_committed_h200_run(tmp_path):
    """The README's table is ``gpu_summary --readme`` of the committed run alone (#57), whose first part
    (triton-check, a part of the plans before the Triton pass went) names no transformers: the run's versions come
    from the first part that names each."""
    folder = ROOT / "benchmarks" / "results" / "gpu" / "nvidia-h200-20261127"
    summary = gpu_summary.summarize(folder)
    assert summary["run"] == {"device": "cuda", "device_name": "NVIDIA H200", "torch": "2.11.0+cu130",
                              "transformers": "5.23.0", "judged": True}
    assert summary["targets"]["row_counts"] == {"met": 20, "not_met": 10, "not_measured": 0}
    table = gpu_summary.markdown_table(summary, "benchmarks/results/gpu/nvidia-h200-20261127")
    start, end = gpu_summary.README_MARKERS
    readme = (ROOT / "README.md").read_text()
    assert readme.split(start)[1].split(end)[0].strip() == table
    over = {(c["target"], c["row"]) for c in summary["targets"]["checks"] if c["met"] is False}
    assert over - set(gpu_summary.WHY) == {("flex lpea bias gradient", "lpea-rhe")}  # every other one says why
    assert ("triton pass over compiled", "triton") in over  # the measurement that removed it (still read)


def test_rel_pos_check_refuses_the_cpu_without_triton_s_interpreter(monkeypatch, capsys):
    """``rel_pos_check.py`` (gpu.sh's rel-pos-check; ``SMOKE=1`` runs it interpreted at the tiny shape)."""
    import rel_pos_check

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        rel_pos_check.main(["--device", "cpu", "--shape", "tiny"])
    assert "only under Triton's interpreter (TRITON_INTERPRET=1)" in capsys.readouterr().err
