"""Which pass computes EaDRA's regularizers: the one reader of the ``implementation`` setting
(``eadra={"implementation": ...}``).

Three passes give the same R_peak, R_sent and R_dist (Eq. 4, 6, 8) of several layers, with the same arguments
(:func:`layer_regularizers`, their common entry):

* eager: :func:`hf_headattn.eadra_math.layer_regularizers`, one operation at a time;
* compiled: the same function with its map-sized work under ``torch.compile`` (:mod:`hf_headattn.fused_passes`);
* Triton: :mod:`hf_headattn.eadra_triton`'s kernels, which never write a (queries x keys) map.

The setting is checked once, when the settings are resolved (:func:`check_implementation`, called by
:meth:`hf_headattn.eadra.EaDRASettings.resolved`); each pass is chosen by :func:`choose_pass`. The Triton module is
imported by name, only when chosen (:func:`_triton_pass`): the model never imports it (nor Triton) otherwise, and
transformers' remote code, which ships every module a ``from .x import`` line names (inside a function too), leaves
it out of a checkpoint unless its config chooses it (:func:`model_module`, :mod:`hf_headattn.remote_code`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings

import torch

from .eadra_math import layer_regularizers as fused_layer_regularizers
from .fused_passes import compile_failed

#: The values of the setting (the ``Literal`` of ``EaDRASettings.implementation`` lists the same).
IMPLEMENTATIONS = ("auto", "eager", "compiled", "triton")
#: The devices on which "auto" compiles the pass.
AUTO_COMPILED_DEVICES = ("cuda",)
#: The module holding the Triton pass, imported by name (:func:`_triton_pass`).
TRITON_MODULE = "eadra_triton"
#: The module a checkpoint's ``auto_map`` names when its config chooses the Triton pass: the model classes and the
#: Triton module, so that transformers ships (and its loader fetches) ``eadra_triton.py`` with it.
TRITON_MODEL_MODULE = "modeling_eadra_triton"


@functools.cache  # asked at every pass: the answer does not change within a process
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def check_implementation(implementation, name: str = "implementation") -> None:
    """Refuse a value not in :data:`IMPLEMENTATIONS` (``ValueError`` naming it and the allowed ones); for "triton",
    warn when the pass cannot run here (no Triton; no CUDA device and no ``TRITON_INTERPRET=1``): a config may be
    built, loaded or used for ``generate`` anywhere, but a forward that computes the terms then raises (the Triton
    module names what it lacks)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{name} must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation != "triton":
        return
    if not _has_triton():
        missing = "Triton, which is not installed (pip install triton)"
    elif not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        missing = "a CUDA device (or TRITON_INTERPRET=1 on the CPU, Triton's interpreter), which this machine lacks"
    else:
        return
    message = (f"{name}='triton' needs {missing}: a forward that computes EaDRA's terms will raise; 'auto', "
               "'eager' or 'compiled' give the same terms here")
    if message not in _WARNED:  # once a process: the settings are resolved again at every change of the config
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=2)


_WARNED: set[str] = set()


def choose_pass(implementation: str, device: torch.device) -> str:
    """The pass for heads on ``device``: "triton", or a :mod:`~hf_headattn.fused_passes` mode ("eager", "compiled",
    or "compiled_or_eager": compiled, eager once a compile has failed in this process).

    "auto" compiles on :data:`AUTO_COMPILED_DEVICES` where Triton is installed (Inductor's GPU code needs it) and
    no compile has failed; it never chooses the Triton pass (slower than the compiled pass on an H100: 9.7 against
    5.2 ms forward and backward at transformer-base, ``benchmarks/results/gpu``). Inside a compiled model (asked first:
    the look for Triton was a graph break on torch 2.11) every pass is the plain function, "eager", which the model's
    graph fuses; so is the Triton pass.
    """
    if torch.compiler.is_compiling():
        return "eager"
    if implementation == "auto":
        compiles = device.type in AUTO_COMPILED_DEVICES and _has_triton() and not compile_failed()
        return "compiled_or_eager" if compiles else "eager"
    if implementation in ("eager", "compiled", "triton"):
        return implementation
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


def layer_regularizers(queries, keys, num_heads: int, scaling: float, support: torch.Tensor,
                       query_mask: torch.Tensor, bias: torch.Tensor | None = None, recompute: bool = True,
                       implementation: str = "auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """R_peak, R_sent and R_dist, each (L, B, h), by the pass :func:`choose_pass` gives: the arguments and results of
    :func:`hf_headattn.eadra_math.layer_regularizers` (the Triton pass always recomputes, whatever ``recompute``)."""
    chosen = choose_pass(implementation, queries[0].device)
    if chosen == "triton":
        return _triton_pass().layer_regularizers(queries, keys, num_heads, scaling, support, query_mask, bias)
    return fused_layer_regularizers(queries, keys, num_heads, scaling, support, query_mask, bias, recompute, chosen)


def _triton_pass():
    """:mod:`hf_headattn.eadra_triton` (or a checkpoint's own copy, beside this module), imported on first use."""
    return importlib.import_module(f".{TRITON_MODULE}", __package__)


def model_module(settings) -> str | None:
    """``MethodSpec.model_module`` (:mod:`hf_headattn.remote_code`): :data:`TRITON_MODEL_MODULE` when ``settings``
    choose the Triton pass, else None."""
    return TRITON_MODEL_MODULE if settings.implementation == "triton" else None
