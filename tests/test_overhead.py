"""No host-device synchronisation in a training step, counted on the CPU as the operators that read a
tensor's value on the host (each one a synchronisation on a GPU)."""

import json

import pytest
import torch

from conftest import TINY, batch, syntax_batch
from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from operator_count import sync_operators

SETTINGS = {
    "off": {},
    "dhicm": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1]}},
    "eadra": {"eadra": {"encoder": {}, "decoder": {}, "cross": {}}},
    "dea-rhe": {"sea": {"type": "dea", "encoder_layers": [0, 1]}},
    "lpea-rhe": {"sea": {"type": "lpea", "encoder_layers": [0, 1]}},
}


def syncs(settings):
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **settings)).train()
    inputs = syntax_batch() if "sea" in settings else batch()
    model(**inputs).loss.backward()  # warm-up
    # on the path an accelerator takes: SEA's value check of phrase_positions reads them on the host only on the CPU
    return sync_operators(lambda: model(**inputs).loss.backward())


def test_the_counter_sees_host_reads():
    t = torch.tensor([1, 0, 2])
    assert sync_operators(lambda: (t[0].item(), bool(t.any()), t.nonzero(), t[t > 0], torch.unique(t))) == [
        "aten._local_scalar_dense.default", "aten._local_scalar_dense.default", "aten.nonzero.default",
        "aten.index.Tensor", "aten._unique2.default"]
    assert sync_operators(lambda: (t + 1, t[t.argsort()], t.masked_fill(t > 0, 0), t.repeat_interleave(2))) == []


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_training_step_reads_no_value_on_the_host_beyond_stock(name):
    assert syncs(SETTINGS[name]) == syncs({})  # (what HF itself does, if anything, is the same for every row)


def test_bad_phrase_positions_still_raise_once_per_forward():
    inputs = syntax_batch()
    inputs["phrase_positions"] = inputs["phrase_positions"].clone()
    inputs["phrase_positions"][0, 0, 1] = 10000
    torch.manual_seed(0)
    model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**TINY, **SETTINGS["lpea-rhe"]))
    with pytest.raises(ValueError, match="phrase_positions contains 10000"):
        model(**inputs)


# Counted overhead (FLOPs, bytes saved for backward) under FakeTensorMode.

def test_saved_counter_counts_each_storage_once_and_leaves_out_parameters():
    from counting import SavedCounter

    x = torch.randn(3, 5, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(5, 7))
    with SavedCounter([w]) as saved:  # mm saves x and w (w left out), relu its output (3x7)
        y = (x @ w).relu()
    assert saved.bytes == (3 * 5 + 3 * 7) * 4 and len(saved.storages) == 2
    with SavedCounter() as saved:  # a view saved beside its base is one storage; parameters counted when not left out
        z = (x * x.t().t()) @ w
    assert saved.bytes == (3 * 5 + 3 * 5 + 5 * 7) * 4  # x (once), x * x's output, w
    with SavedCounter() as saved, torch._subclasses.fake_tensor.FakeTensorMode() as mode:  # the same on fake tensors
        fx, fw = mode.from_tensor(x), mode.from_tensor(w)
        y = (fx @ fw).relu()
        (fx * fx.t().t()).sum()
    assert saved.bytes == (3 * 5 + 5 * 7 + 3 * 7) * 4 and len(saved.storages) == 3
    del y, z


def test_written_counter_counts_outputs_in_place_writes_and_no_views():
    from counting import WrittenCounter

    x = torch.randn(3, 5)
    with WrittenCounter() as written:  # views and reshapes of a contiguous tensor write nothing
        y = x.t().view(5, 3).transpose(0, 1).unsqueeze(0).expand(2, 3, 5)[1, :, 1:].reshape(3, 4).detach()
    assert written.bytes == 0 and written.by_op == {}
    with WrittenCounter() as written:  # an output, an in-place write, an out= write (into a slice: its size)
        z = x @ torch.randn(5, 7)  # 3 x 7, plus the 5 x 7 randn
        z.add_(1)
        torch.mul(x[:, :2], 2, out=y[:, :2])
        torch.empty(100, 100)  # allocated, not written
    assert written.by_op == {"aten.randn": 5 * 7 * 4, "aten.mm": 3 * 7 * 4, "aten.add_": 3 * 7 * 4,
                             "aten.mul": 3 * 2 * 4}
    assert written.bytes == (5 * 7 + 3 * 7 + 3 * 7 + 3 * 2) * 4
    assert list(written.top(2)) == ["aten.randn", "aten.mm"]
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode, WrittenCounter() as written:  # fake: same counts
        fx = mode.from_tensor(x)
        (fx.t().contiguous() * 2).sum()  # a copy (the transpose is a view), a product, a scalar sum
    assert written.by_op == {"aten.clone": 15 * 4, "aten.mul": 15 * 4, "aten.sum": 4}


@pytest.mark.slow
def test_counted_mode_at_the_tiny_shape(tmp_path):
    import overhead

    out = tmp_path / "counted.json"
    result = overhead.main(["--count", "--shapes", "tiny", "--rows", "off", "eadra-scratch", "rel-pos-triton",
                            "--out", str(out)])
    assert json.loads(out.read_text()) == result
    rows = result["shapes"]["tiny"]["rows"]
    assert set(rows) == {"stock", "off", "eadra-scratch", "rel-pos-triton", "naive"}
    # Rel_Pos's kernels counted on the fake CPU tensors: their operators' outputs, their products' FLOPs (without the
    # formula the attention of its three layers would count nothing: below stock's)
    kernels = rows["rel-pos-triton"]
    assert "hf_headattn.rel_pos_attention_backward_hf_headattn_methods_rel_pos_tiled" in kernels["written_by_op"]
    assert 1.0 < kernels["flops_ratio"] < 1.05 and kernels["written_ratio"] < 1.10
    for row in rows.values():
        assert {"flops", "flops_ratio", "saved_bytes", "saved_ratio", "targets"} <= set(row)
    assert rows["off"]["flops"] == rows["stock"]["flops"] > 0
    assert rows["off"]["flops_ratio"] == rows["off"]["saved_ratio"] == 1.0
    # (the method model's loss saves its token count as the divisor of two divisions: two int64 scalars)
    assert 0 <= rows["off"]["saved_bytes"] - rows["stock"]["saved_bytes"] <= 16
    assert rows["naive"]["saved_ratio"] > 1.0  # every probability map kept for the entropy term
    assert rows["off"]["targets"]["within"] is True
    assert set(rows["eadra-scratch"]["targets"]) == {"flops_target", "flops", "saved_target", "saved",
                                                     "written_target", "written", "within"}
    assert rows["eadra-scratch"]["targets"]["saved_target"] == 1.10
    assert rows["eadra-scratch"]["targets"]["written_target"] == 1.40
    assert abs(rows["off"]["written_ratio"] - 1.0) < 1e-3 and rows["off"]["written_bytes"] > 0
    assert rows["naive"]["written_ratio"] > 1.0 and rows["eadra-scratch"]["written_ratio"] > 1.0
    assert set(rows["eadra-scratch"]["written_by_op"]) <= {"aten." + name for name in dir(torch.ops.aten)}


# DHICM's host work: the operators one module adds to a training step (#47), pinned so that a regression fails.

#: ATen operators of one DHICM module's forward (``after``: U x with the CPU dropout, Eq. 1-3, Eq. 4's KL and the
#: statistics) and backward, by mode: 93 and 79 before #47 (paper mode's HeadMixture, shared token weights), 80 before
#: issue 63 (softmax's backward in one operator), 76 before its item 4's second round (Eq. 4's weighted mean one `dot`,
#: the broadcast views of p, G and the gradients made once).
DHICM_LAYER_OPERATORS = {"paper": 71, "scaled_out_proj": 74}


def dhicm_layer_operators(mode: str) -> int:
    from hf_headattn.attention import AttentionCall, HeadAttnContext
    from hf_headattn.methods.dhicm.core import DHICM
    from operator_count import count_operators

    torch.manual_seed(0)
    method = DHICM(16, 4, 16, 0.1, mode).train()
    method.init_weights(0.02)
    hidden, heads = torch.randn(2, 5, 16, requires_grad=True), torch.randn(2, 5, 4, 4, requires_grad=True)
    query = torch.randn(2, 4, 5, 4)
    module = torch.nn.Module()
    module.headattn_side, module.headattn_kind = "encoder", "self"
    context = HeadAttnContext(source_mask=torch.arange(5) < torch.tensor([[5], [3]]))
    call = AttentionCall(module, query, query, query, None, 1.0, hidden, context, {})
    grad_output, grad_kl = torch.ones(heads.shape if mode != "paper" else hidden.shape), torch.tensor(1.0)

    def forward_backward():
        output = method.after(call, heads)
        kl = context.recorded("dhicm")[-1][0]
        torch.autograd.backward([output, kl], [grad_output, grad_kl])

    forward_backward()
    assert all(parameter.grad is not None for parameter in method.parameters())  # every parameter is trained
    return count_operators(forward_backward)


@pytest.mark.parametrize("mode", sorted(DHICM_LAYER_OPERATORS))
def test_dhicm_module_operators_stay_at_their_ceiling(mode):
    assert dhicm_layer_operators(mode) <= DHICM_LAYER_OPERATORS[mode]


def test_compile_mode_is_refused_without_compile(capsys):
    import overhead

    with pytest.raises(SystemExit):
        overhead.main(["--compile-mode", "reduce-overhead", "--rows", "dhicm"])
    assert "--compile-mode reduce-overhead: only with --compile" in capsys.readouterr().err


@pytest.mark.slow
def test_reduce_overhead_rows_run_against_stock_compiled_the_same_way(tmp_path):
    """gpu.sh's reduce-overhead parts on the CPU, where the mode falls back to the default (aot_eager ignores it)."""
    import overhead

    result = overhead.main(["--shape", "tiny", "--rows", "dhicm", "--compile", "--compile-backend", "aot_eager",
                            "--compile-mode", "reduce-overhead", "--repeats", "1", "--warmup", "1",
                            "--out", str(tmp_path / "ro.json")])
    assert result["compile"]["mode"] == "reduce-overhead"
    for row in result["rows"].values():
        assert "error" not in row and row["compile"]["graph_breaks"] == 0 and row["compile"]["recompiles"] == 0


# The kernels Inductor generates for a compiled step (issue 63: a compiled step's host work on a GPU is its launches).

WRAPPER = """
cpp_fused_add_0 = async_compile.cpp_pybinding(['const float*', 'float*'], r'''
extern "C" void kernel(const float* in_ptr0, float* out_ptr0) {}
''')
triton_poi_fused_mul_1 = async_compile.triton('triton_poi_fused_mul_1', '''
def triton_poi_fused_mul_1(in_ptr0, out_ptr0, xnumel, XBLOCK : tl.constexpr): pass
''')
async_compile.wait(globals())
class Runner:
    def call(self, args):
        buf0 = empty_strided_cpu((4, 4), (4, 1), torch.float32)
        cpp_fused_add_0(arg0_1, buf0)
        extern_kernels.mm(buf0, arg1_1, out=buf1)
        triton_poi_fused_mul_1.run(buf1, buf2, 16, stream=stream0)
        cpp_fused_add_0(buf2, buf3)
        buf4 = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(buf3, buf3, buf3)
        return (reinterpret_tensor(buf3, (16, ), (1, ), 0), )
"""


def test_wrapper_calls_are_the_launches_and_library_calls_of_a_wrapper():
    from compile_check import wrapper_calls

    launches, extern = wrapper_calls(WRAPPER)
    assert launches == ["cpp_fused_add_0", "triton_poi_fused_mul_1", "cpp_fused_add_0"]  # a kernel run twice: twice
    assert extern == ["extern_kernels.mm",
                      "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default"]


@pytest.mark.slow
def test_inductor_kernels_counts_a_compiled_function():
    from compile_check import inductor_kernels

    torch._dynamo.reset()
    x = torch.randn(8, 8)
    compiled = torch.compile(lambda t: ((t.sin() + 1) @ t).relu().sum(), backend="inductor")
    counts = inductor_kernels(lambda: compiled(x))
    assert counts["graphs"] == 1 and counts["extern_calls"] == 1  # the matmul
    assert counts["kernels"] >= 1 and 2 <= counts["launches"] <= 3  # before and after the matmul
    assert inductor_kernels(lambda: compiled(x)) == {"kernels": 0, "launches": 0, "extern_calls": 0, "graphs": 0}
    torch._dynamo.reset()
