"""torch.compile with every method and their combination, on the CPU: compiled loss and gradients equal eager ones,
no graph break inside the model's forward, no recompilation across steps of one shape, and ``generate`` with a
compiled forward gives eager's tokens.

Users compile in two ways, both checked: the whole model (``torch.compile(model)``, the Trainer's
``torch_compile=True``) and each layer on its own (regional compilation, accelerate's ``use_regional_compilation``).
The second makes the per-forward :class:`~hf_headattn.attention.HeadAttnContext` an input of every compiled frame, as
a graph break above the layers does: a guard on per-step state in the context (a tensor's identity, a list's length)
then shows here as a recompilation. On an H200 (torch 2.11) the whole-model compile broke above the layers and DHICM
recompiled every step on its mask's identity, which a whole-model compile on the CPU, one graph with the context
inside it, cannot show.

The backend is ``aot_eager`` (dynamo and AOTAutograd, forward and backward, without code generation: fast);
tests/test_compile_inductor.py runs Inductor on the combination.
"""

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from compile_check import NO_DROPOUT, SETTINGS, fresh_batch
from conftest import TINY, batch, syntax_batch
from counting import SavedCounter
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration, losses

pytestmark = pytest.mark.slow  # every test compiles


def model_and_inputs(name: str, layers: int = 2):
    torch.manual_seed(0)
    shape = {**TINY, "encoder_layers": layers, "decoder_layers": layers}
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**shape, **NO_DROPOUT, **SETTINGS[name]))
    return model.train(), (syntax_batch() if "sea" in SETTINGS[name] else batch())


def step(model, inputs) -> tuple[torch.Tensor, dict]:
    """One training step's loss and gradients, on fresh copies of the inputs (new tensors each step, as a data
    loader gives)."""
    model.zero_grad(set_to_none=True)
    loss = model(**{key: value.clone() for key, value in inputs.items()}).loss
    loss.backward()
    grads = {name.removeprefix("_orig_mod."): p.grad for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def compiled_steps(name: str, regional: bool, steps: int = 3, layers: int = 2, backend: str = "aot_eager"):
    """Eager and compiled copies of one model stepped side by side: [(eager, compiled) per step], the graphs
    compiled after the first step and after the last, and the graph breaks."""
    eager, inputs = model_and_inputs(name, layers)
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    if regional:
        for stack in (model.model.encoder, model.model.decoder):
            for layer in stack.layers:
                layer.compile(backend=backend)
        run = model
    else:
        run = torch.compile(model, backend=backend)
    results, graphs = [], []
    for _ in range(steps):
        results.append((step(eager, inputs), step(run, inputs)))
        graphs.append(counters["stats"]["unique_graphs"])
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    return results, graphs, breaks


def assert_equal_steps(results):
    for (eager_loss, eager_grads), (loss, grads) in results:
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        assert grads.keys() == eager_grads.keys()
        for key in grads:
            torch.testing.assert_close(grads[key], eager_grads[key], rtol=1e-4, atol=1e-6, msg=key)


# (the combination, "all": test_compile_inductor.py, the same checks with Inductor)
@pytest.mark.parametrize("name", sorted(set(SETTINGS) - {"all"}))
def test_whole_model_compiles_in_one_graph_and_equals_eager(name):
    results, graphs, breaks = compiled_steps(name, regional=False)
    assert breaks == 0  # as the stock model (the "off" row)
    assert graphs[0] >= 1 and graphs[-1] == graphs[0]  # nothing compiled after the first step
    assert_equal_steps(results)


#: (rows, source, target) of batches whose lengths and length ratio vary: eager EaDRA fuses its encoder's and
#: decoder's passes while padding adds at most half their score entries (``eadra.MAX_PADDING``: a ratio within
#: sqrt(3)), so the ratios cross that threshold both ways, with the source longer and shorter than the target. The
#: second batch changes every length (they become dynamic); rows above 1 (dynamo specializes on sizes 0 and 1).
VARYING_BATCHES = [(4, 8, 7), (3, 12, 5), (2, 6, 11), (4, 10, 9), (3, 7, 10)]


def varying_length_steps(settings: dict, autocast: bool = False, dtype: torch.dtype = torch.float32):
    """Eager and compiled (dynamo alone, the ``eager`` backend: what decides a recompilation, and the cheapest) copies
    of a tiny model (cast to ``dtype``) stepped over :data:`VARYING_BATCHES`: [(eager, compiled) per step], the graphs
    compiled after each step, and the graph breaks."""
    torch.manual_seed(0)
    eager = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **NO_DROPOUT, **settings)).train()
    eager = eager.to(dtype)
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    counters.clear()
    run, results, graphs = torch.compile(model, backend="eager"), [], []
    try:
        for seed, size in enumerate(VARYING_BATCHES):
            inputs = fresh_batch(seed, eager.config, "cpu", sea="sea" in settings, size=size)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                results.append((step(eager, inputs), step(run, inputs)))
            graphs.append(counters["stats"]["unique_graphs"])
        return results, graphs, sum(counters["graph_break"].values())
    finally:
        torch._dynamo.reset()


# "all" (every method in one model: a method that compiled again would show there) on both ends; EaDRA alone (its
# passes fused by the lengths, which "all" also changes) and stock on the lowest
@pytest.mark.parametrize("name", ["all", pytest.param("eadra", marks=pytest.mark.lowest_only),
                                  pytest.param("off", marks=pytest.mark.lowest_only)])
def test_batches_of_varying_lengths_compile_once_more_at_most(name):
    """Real batches vary in both lengths: the second batch compiles the model again, with dynamic lengths, and no
    later batch compiles anything, whatever its lengths; each step equals eager's. EaDRA chose its fused passes from
    the lengths, a guard of the compiled graph: a batch whose ratio crossed the threshold compiled again (EaDRA and
    the combination: 4 graphs in these 5 batches)."""
    results, graphs, breaks = varying_length_steps(SETTINGS[name])
    assert breaks == 0
    assert graphs[1] <= graphs[0] + 1 and graphs[-1] == graphs[1], graphs
    assert_equal_steps(results)


@pytest.mark.lowest_only  # this package's and torch's code alone (tests/conftest.py's LOWEST_ONLY)
def test_the_loss_without_logits_under_autocast_compiles_once_more_at_most():
    """bf16 autocast takes our chunked loss (``losses.chunked_linear_smoothed_nll``): a custom operator, as torch's
    is; as an ``autograd.Function`` its loop over the chunks compiled again at every new length (a graph per
    batch)."""
    results, graphs, breaks = varying_length_steps({"loss_without_logits": True, "label_smoothing": 0.1},
                                                   autocast=True)
    assert breaks == 0
    assert graphs[1] <= graphs[0] + 1 and graphs[-1] == graphs[1], graphs
    assert_equal_steps(results)



@pytest.mark.parametrize("loss_without_logits", [False, pytest.param(True, marks=pytest.mark.lowest_only)])
def test_a_model_cast_to_bf16_compiles_once_more_at_most(loss_without_logits, monkeypatch):
    """A model cast to bf16 (``overhead.py --precision bf16``, not autocast) has bf16 logits, whose loss is our
    chunked one (``losses.chunked_smoothed_nll``, in training with ``loss_without_logits`` off and in evaluation with
    it on); with it on, training takes ``losses.chunked_linear_smoothed_nll``. Both are custom operators: as an
    ``autograd.Function`` the first's loop over its chunks compiled again at every new length (5 graphs in these 5
    batches; stock ``MBartForConditionalGeneration`` cast to bf16: 2). Several chunks a batch, as at real sizes."""
    monkeypatch.setattr(losses, "chunk_rows", lambda *shape: 8)
    results, graphs, breaks = varying_length_steps({"loss_without_logits": loss_without_logits,
                                                    "label_smoothing": 0.1}, dtype=torch.bfloat16)
    assert breaks == 0
    assert graphs[1] <= graphs[0] + 1 and graphs[-1] == graphs[1], graphs
    assert_equal_steps(results)


@pytest.mark.lowest_only  # torch's flex kernels / compiler: tests/conftest.py's LOWEST_ONLY
def test_the_cuda_only_branches_compile_in_one_graph(monkeypatch):
    """The branches a model takes only on CUDA, taken on the CPU: EaDRA's "auto" pass, which compiles itself on CUDA
    (:mod:`~.eadra.compiled`, chosen by :mod:`~.eadra.passes`), and so looks for Triton
    (``importlib.util.find_spec``, which torch 2.11 does not trace: a graph break inside a compiled model). On an H100
    that look broke the whole-model compile of EaDRA into 13 graphs (6 breaks) while the CPU, which never took the
    branch, showed one."""
    from hf_headattn.methods.eadra import compiled as fused_passes
    from hf_headattn.methods.eadra import passes as eadra_passes

    monkeypatch.setattr(eadra_passes, "AUTO_COMPILED_DEVICES", ("cpu",))
    monkeypatch.setattr(fused_passes, "COMPILE_BACKEND", "aot_eager")  # the eager copy's own compiled pass: fast
    monkeypatch.setattr(fused_passes, "_compiled", {})
    # the look for Triton as torch 2.11 traced it (find_spec at each call), a graph break, and Triton found
    monkeypatch.setattr(eadra_passes, "triton_installed", lambda: torch._dynamo.graph_break() or True)
    results, graphs, breaks = compiled_steps("all", regional=False, steps=2)  # every method, EaDRA's three components
    assert breaks == 0 and graphs[-1] == graphs[0]  # (the eager copy's passes compile themselves: graphs too)
    assert_equal_steps(results)


def saved_bytes(run, model, inputs) -> int:
    """Bytes of the distinct storages one forward of ``run`` keeps for the backward, parameters left out
    (``benchmarks/counting.py``'s counter), then the backward."""
    with SavedCounter(exclude=list(model.parameters())) as saved:
        loss = run(**inputs).loss
    loss.backward()
    return saved.bytes


@pytest.mark.lowest_only  # this package's and torch's code alone (tests/conftest.py's LOWEST_ONLY)
def test_a_compiled_model_recomputes_eadras_maps_in_the_backward():
    """EaDRA keeps no (queries x keys) map for the backward (it recomputes them from the heads), compiled as eagerly.
    A compiled graph holds forward and backward together and Inductor's partitioner (``aot_eager_decomp_partition``
    uses the same) chooses what to keep: without the checkpoint mark it kept the maps, 3.3x the eager model's saved
    bytes here and 1.40x stock's peak memory on an H100 at transformer-base."""
    torch.manual_seed(0)
    config = HeadAttnMBartConfig(**{**TINY, "max_position_embeddings": 128}, **NO_DROPOUT, **SETTINGS["eadra"])
    eager = HeadAttnMBartForConditionalGeneration(config).train()
    ids = torch.randint(3, config.vocab_size, (8, 96))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.flip(1)}
    expected = saved_bytes(eager, eager, inputs)
    torch._dynamo.reset()
    try:
        model = copy.deepcopy(eager)
        compiled = saved_bytes(torch.compile(model, backend="aot_eager_decomp_partition"), model, inputs)
    finally:
        torch._dynamo.reset()
    assert compiled <= 1.05 * expected, (compiled, expected)


def test_regional_compilation_compiles_each_layer_kind_once():
    """Four layers a side: the layers of one kind share one compiled version (a version per layer would exhaust
    dynamo's recompile limit, 8, at mBART-large's 12 + 12 layers and run the rest eagerly), and no step after the
    first compiles anything (the H200's failure: DHICM's cache keyed by the mask's identity recompiled every step)."""
    results, graphs, breaks = compiled_steps("all", regional=True, layers=4)
    assert breaks == 0
    assert graphs[-1] == graphs[0]
    # 5 versions of the layers' shared code: enough to tell the encoder's and the decoder's layers apart, with and
    # without methods, and the first layer that records (a version per layer would stop at the limit, 8, and run the
    # layers after it eagerly: what a list of records, guarded on its length, did)
    assert graphs[0] == 5
    assert_equal_steps(results)


def test_generate_with_a_compiled_forward_gives_eager_tokens():
    """Every method at once (each one's own path under generate: DHICM's fused mixing, SEA's masks, EaDRA idle)."""
    model, inputs = model_and_inputs("all")
    model.eval()
    source = {key: inputs[key] for key in ("input_ids", "attention_mask", "dependency_mask", "phrase_positions")
              if key in inputs}
    expected = model.generate(**source, max_new_tokens=6, num_beams=2, do_sample=False)
    torch._dynamo.reset()
    counters.clear()
    model.forward = torch.compile(model.forward, backend="aot_eager")
    try:
        first = model.generate(**source, max_new_tokens=6, num_beams=2, do_sample=False)
        graphs = counters["stats"]["unique_graphs"]
        second = model.generate(**{k: v.clone() for k, v in source.items()}, max_new_tokens=6, num_beams=2,
                                do_sample=False)
        assert sum(counters["graph_break"].values()) == 0
        assert counters["stats"]["unique_graphs"] == graphs  # a second call compiles nothing
    finally:
        torch._dynamo.reset()
    assert torch.equal(first, expected) and torch.equal(second, expected)
