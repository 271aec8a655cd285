"""Tiny random models (vocab 99, d_model 16, 2+2 layers, 4 heads) saved as stock HF checkpoints."""

import gc
import gzip

import pytest
import torch
from transformers import MarianConfig, MarianMTModel, MBartConfig, MBartForConditionalGeneration

import hf_headattn

TINY = dict(
    vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=0, forced_eos_token_id=None,
)

#: Test modules that run in the lowest environment only (marked ``lowest_only``; ``make test-newest`` passes
#: ``-m "not lowest_only"``): what they check does not depend on the transformers release the package meets. The
#: research workshop, the benchmark scripts (whose GPU runs carry the lowest release's wheels, benchmarks/gpu.sh),
#: the wheel's contents, the API reference's configuration and DeepSpeed through the Trainer (two torchrun launches;
#: the newest release's Trainer meets DeepSpeed in HF's own common tests): about three CPU-minutes of the newest run.
LOWEST_ONLY = ("test_benchmarks_profile.py", "test_converged_study.py", "test_deepspeed.py", "test_docs.py",
               "test_fidelity_study.py",
               "test_gpu_script.py", "test_jobs.py", "test_long_run.py", "test_overhead.py", "test_packaging.py",
               "test_search.py",
               # the comparison methods' compile and flex checks: torch's compiler and flex kernels, not transformers'
               "test_rel_pos_compile.py", "test_localness_compile.py", "test_localness_flex.py",
               # the tiled kernels under Triton's interpreter (the lowest end's environment has Triton: Makefile)
               "test_rel_pos_tiled.py",
               # Inductor's code and flex kernels on the methods (torch's compilers; the newest end keeps the aot_eager
               # whole-model compiles of test_compile.py and hf_compat's flex contract test)
               "test_compile_inductor.py", "test_eadra_compiled.py", "test_flex.py",
               # EaDRA's tiled Triton kernels under Triton's interpreter (Triton's business, not transformers')
               "test_eadra_tiled.py",
               # the methods' pure math (torch alone) and the Multi30k download (no transformers)
               "test_eadra_math.py", "test_eadra_lean.py", "test_sea_math.py", "test_rel_pos_math.py",
               "test_localness_math.py", "test_multi30k.py")


def pytest_collection_modifyitems(config, items):
    missing = [name for name in LOWEST_ONLY if not any((config.rootpath / "tests").rglob(name))]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py's LOWEST_ONLY names {missing}, which tests/ lacks")
    for item in items:
        if item.path.name in LOWEST_ONLY:
            item.add_marker(pytest.mark.lowest_only)


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


@pytest.fixture(scope="session")
def multi30k():
    """Multi30k's folder, found as the recipes find it (:func:`hf_headattn.experiment.multi30k.find_multi30k`:
    ``HF_HEADATTN_DATA``, ``../shared/data/multi30k``, the cache, else a download); the tests that need it skip,
    with the reason, where no copy can be had."""
    from hf_headattn.experiment.multi30k import Multi30kChecksumError, Multi30kNotFoundError, find_multi30k

    try:
        return find_multi30k(timeout=10)
    except (Multi30kNotFoundError, Multi30kChecksumError) as error:
        pytest.skip(f"no copy of Multi30k: {error}")


@pytest.fixture(scope="session")
def multi30k_lines(multi30k):
    """``multi30k_lines(prefix, lang, n=None)``: the first ``n`` lines of ``<prefix>.<lang>.gz`` (prefix ``train``,
    ``val`` or ``test_2016_flickr``), without their newlines."""

    def read(prefix: str, lang: str, n: int | None = None) -> list[str]:
        with gzip.open(multi30k / f"{prefix}.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[:-1]  # each file ends with a newline
        return lines if n is None else lines[:n]

    return read


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


def greedy_by_full_forward(model, inputs, steps):
    """Greedy decoding that reruns the whole model (encoder included) at every step, EOS suppressed: what
    ``generate`` with a cache must give (the encoder-side methods' inputs in ``inputs``)."""
    tokens = torch.full((2, 1), model.config.decoder_start_token_id)
    for _ in range(steps):
        with torch.no_grad():
            next_logits = model(**inputs, decoder_input_ids=tokens, use_cache=False).logits[:, -1]
        next_logits[:, model.config.eos_token_id] = float("-inf")
        tokens = torch.cat([tokens, next_logits.argmax(-1, keepdim=True)], dim=1)
    return tokens


@pytest.fixture
def scalar_inductor():
    """Inductor's C++ kernels without SIMD (``cpp.simdlen = 1``) for a test that compiles a model with it on the CPU:
    the vectorised kernels took a third more CPU time to compile (138 -> 94 s for tests/test_compile_inductor.py with
    an empty cache), and the vector code is Inductor's, not this package's (a GPU compiles Triton kernels). Not for
    flex attention, whose CPU template needs SIMD."""
    import torch._inductor.config

    with torch._inductor.config.patch({"cpp.simdlen": 1}):
        yield


@pytest.fixture(autouse=True, scope="module")
def _earlier_objects_frozen():
    """Each test module starts with the objects still alive frozen (``gc.freeze``: no collection scans them again).
    The Trainer (through accelerate) runs ``gc.collect()`` three times a run, and a collection over every object the
    earlier modules left (over a million after the compile tests) took a second each time."""
    gc.collect()
    gc.freeze()
