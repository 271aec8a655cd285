"""The benchmarks' models, batches and training step, shared by ``overhead.py`` (timing), ``counting.py`` (counting
under ``FakeTensorMode``), ``profile_step.py`` and ``long_run.py``: each row's model gets the same random weights and
batch as stock's, and one step is what the Trainer takes.

``SHAPES``: model shape, batch size, sequence length; ``ROWS``: row name -> config fields; ``PRECISIONS``: how a step
runs (``autocast-bf16`` is ``Seq2SeqTrainer(bf16=True)``).
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import MBartConfig, MBartForConditionalGeneration

from hf_headattn import HeadAttnMBartConfig, HeadAttnMBartForConditionalGeneration
from hf_headattn.experiment.presets import method_settings
from hf_headattn.registry import active_methods, method_inputs

SHAPES = {  # model shape, batch size, sequence length (source = target)
    "tiny": (dict(d_model=128, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256, vocab_size=1000), 16, 32),
    "transformer-base": (dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                              decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                              vocab_size=32000), 32, 256),
    # the Multi30k reproduction's model (presets "small", 8000 BPE), at a CPU-sized batch
    "small": (dict(d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
                   decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=8000), 32, 32),
    "mbart-large-16x128": (dict(vocab_size=250027), 16, 128),
    "mbart-large-8x512": (dict(vocab_size=250027), 8, 512),
}

#: Row name -> config fields: a recipe method name's (``--method``), or written out where no name has them.
ROWS = {
    "off": {},
    # "<row>-no-logits" is <row> with the loss from the decoder's hidden states, without the logits
    "off-no-logits": {"loss_without_logits": True},
    "dhicm": method_settings("dhicm"),
    # DHICM's fine-tuning variant: the pretrained out_proj kept, scaled per head
    "dhicm-finetune": {"dhicm": {"encoder_layers": [-1], "decoder_layers": [-1], "mode": "scaled_out_proj"}},
    "eadra-finetune": {"eadra": {"encoder": {"num_heads": 2}, "decoder": {"num_heads": 2}}},
    "eadra-finetune-no-logits": {"eadra": {"encoder": {"num_heads": 2}, "decoder": {"num_heads": 2}},
                                 "loss_without_logits": True},
    # num_heads default: three quarters of the heads, 6 of 8 at transformer-base (3 of 4 at tiny)
    "eadra-scratch": method_settings("eadra_all"),
    # "<row>-eager-pass": EaDRA's regularizer pass run eagerly ("auto" compiles it on CUDA, fused_passes)
    "eadra-scratch-eager-pass": {"eadra": {**method_settings("eadra_all")["eadra"], "implementation": "eager"}},
    "eadra-finetune-eager-pass": {"eadra": {"encoder": {"num_heads": 2}, "decoder": {"num_heads": 2},
                                            "implementation": "eager"}},
    # "<row>-triton": the pass as tiled Triton kernels that write no (queries x keys) map (methods/eadra/tiled.py)
    "eadra-scratch-triton": {"eadra": {**method_settings("eadra_all")["eadra"], "implementation": "triton"}},
    "dea-rhe": method_settings("dea_rhe"),
    "lpea-rhe": method_settings("lpea_rhe"),
    # Localness (Yang et al.): the Gaussian bias on the lower half of the encoder layers, on every head / with RHE,
    # predicted from the whole query (the authors' code); "-per-head": each head's own query (the earlier reading)
    "localness": method_settings("localness"),
    "localness-rhe": {"localness": {"head_selection": "redundant"}},
    "localness-per-head": {"localness": {"predictor": "head"}},
    # Shaw et al.'s relative positions on every encoder self-attention (k = 16): key term a score bias, value term by
    # taking over every head; "-keys" without the value term (SDPA's path, the bias in its mask)
    # (a table per layer and head, the paper's base model); "-shared-tables": one table per layer (its big model)
    "rel-pos": method_settings("rel_pos"),
    "rel-pos-keys": method_settings("rel_pos_keys"),
    "rel-pos-shared-tables": {"rel_pos": {"tables": "layer"}},
    # "-triton": the flash-style kernels (methods/rel_pos/tiled.py; "auto" keeps the PyTorch path until timed)
    "rel-pos-triton": {"rel_pos": {**method_settings("rel_pos")["rel_pos"], "implementation": "triton"}},
    # the previous- and next-token heads of every encoder layer fixed (2 of 4 heads at tiny, 2 of 8 at base)
    "fixed-attention": method_settings("fixed_attention"),
}


#: ``--precision`` -> (weights dtype, autocast dtype or None). autocast-bf16 is ``Seq2SeqTrainer(bf16=True)``.
PRECISIONS = {
    "autocast-bf16": (torch.float32, torch.bfloat16),
    "fp32": (torch.float32, None),
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
}


def model_inputs(kind, model, batch) -> dict:
    """``batch`` without the method inputs that none of the model's methods reads (all of them for a stock model)."""
    read = {name for spec in active_methods(model.config) for name in spec.inputs} if kind == "ours" else set()
    return {k: v for k, v in batch.items() if k not in method_inputs() or k in read}


def naive_entropy_loss(outputs) -> torch.Tensor:
    """The public EaDRA code's pattern: an entropy term over every materialised attention map."""
    maps = [*outputs.encoder_attentions, *outputs.decoder_attentions, *outputs.cross_attentions]
    return sum(-(a * a.clamp_min(1e-9).log()).sum(-1).mean() for a in maps)


def make_batch(config, batch_size, length, device):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, config.vocab_size, (batch_size, length), generator=generator)
    labels = torch.randint(4, config.vocab_size, (batch_size, length), generator=generator)
    lengths = torch.randint(length // 2, length + 1, (batch_size,), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    ids[~mask] = config.pad_token_id
    batch = {"input_ids": ids, "attention_mask": mask.long(), "labels": labels}
    # SEA's inputs (its forward arguments, MethodSpec.inputs), random as parses are, not its neutral_inputs (which
    # select no redundant head): a dependency mask with a random head per token, phrase positions within +-2
    heads = torch.randint(0, length, (batch_size, length), generator=generator)
    dep = torch.zeros(batch_size, length, length, dtype=torch.bool)
    dep.scatter_(2, heads[..., None], True)
    dep |= dep.transpose(1, 2) | torch.eye(length, dtype=torch.bool)
    batch["dependency_mask"] = dep
    batch["phrase_positions"] = torch.randint(-2, 3, (batch_size, length, length), generator=generator)
    return {k: v.to(device) for k, v in batch.items()}


def build(kind, settings, shape_kwargs, device, dtype, attn_implementation):
    torch.manual_seed(0)
    if kind == "stock" or kind == "naive":
        model = MBartForConditionalGeneration(MBartConfig(**shape_kwargs, dropout=0.1))
    else:
        model = HeadAttnMBartForConditionalGeneration(HeadAttnMBartConfig(**shape_kwargs, dropout=0.1, **settings))
    model.set_attn_implementation("eager" if kind == "naive" else attn_implementation)
    if device is not None:  # (None: leave it where it was built, e.g. fake tensors, which ``to`` cannot swap)
        model = model.to(device=device, dtype=dtype)
    return model.train()


def step_fn(kind, model, batch, autocast_dtype=None):
    """One optimizer step as the Trainer takes it: forward and loss under autocast (if ``autocast_dtype``), backward
    outside it, AdamW fused on CUDA (foreach elsewhere). ``step.optimizer``, ``step.forward_backward``."""
    device_type = next(model.parameters()).device.type
    fused = {"fused": True} if device_type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, **fused)
    inputs = model_inputs(kind, model, batch)

    def forward_backward():
        with autocast(device_type, autocast_dtype):
            outputs = model(**inputs, output_attentions=kind == "naive")
            loss = outputs.loss + (naive_entropy_loss(outputs) if kind == "naive" else 0)
        loss.backward()

    def step():
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step.forward_backward, step.optimizer = forward_backward, optimizer
    return step


def autocast(device_type: str, dtype):
    """``torch.autocast`` to ``dtype`` on ``device_type``; a no-op where ``dtype`` is None."""
    return torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def build_on(device, *args):
    """``build(*args)``, on CUDA initialised on the device (seconds saved per mbart-large model)."""
    with torch.device(device) if device.type == "cuda" else contextlib.nullcontext():
        return build(*args)


def add_model_arguments(parser, shape: str, rows, rows_help: str) -> None:
    """The arguments that choose the models and how a step runs, shared by the scripts: ``--shape``, ``--rows``,
    ``--device``, ``--precision`` (None: :func:`default_precision`) and ``--attn-implementation``."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default=shape)
    parser.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=rows, help=rows_help)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=list(PRECISIONS), default=None,
                        help="autocast-bf16: fp32 weights, bf16 autocast (Seq2SeqTrainer(bf16=True); the default on "
                             "CUDA); bf16/fp16: the model cast; fp32 (the default elsewhere)")
    parser.add_argument("--attn-implementation", default="sdpa")


def default_precision(device: str) -> str:
    """How the Trainer trains there: bf16 autocast on CUDA, fp32 elsewhere."""
    return "autocast-bf16" if device.startswith("cuda") else "fp32"


def timed(step, device) -> float:
    """Milliseconds ``step()`` takes on ``device`` (synchronised before and after on CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000
