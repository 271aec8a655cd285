"""The plug-in interface: everything a method kept outside the package needs, from one import path.

A method is a module (docs/method_template.py is a complete one, run by ``tests/test_plugin.py``): a settings
dataclass (:class:`MethodSettings`), an :class:`AttentionMethod` attached to the attention modules it is placed on,
``METHOD = MethodSpec(...)`` naming both, and optionally ``KIT = MethodKit(...)`` for the recipes (its ``--method``
names, presets, model-card line). ``register_method(METHOD)`` at its end registers it; the recipes'
``--method_modules my_pkg.my_method`` (or an ``import my_method`` before ``translation_recipe.main()``) brings it in.
How a method is built, step by step: docs/design.md, "Adding a fourth method".

What a hook receives (:class:`AttentionCall`): ``query`` (B, H, T, D), ``key`` and ``value`` (B, H, S, D), as
transformers' attention functions get them; ``attention_mask`` None, bool (True = attend) or additive float
(``torch.finfo(dtype).min`` where masked, eager's), broadcastable to (B, H, T, S), or on flex attention a
``BlockMask`` (``call.mask_tensor`` gives it as a bool tensor); ``hidden_states`` (B, T, d_model), the module's
query-side input; ``context`` (:class:`HeadAttnContext`), where loss terms and read-outs are recorded. ``before``
runs before the backend and may change the mask; ``after`` gets the per-head output (B, T, H, D) and returns what
``out_proj`` receives. A change outside attention is ``MethodSpec(prepare_stack=...)``, run once per stack the method
is placed on when the model is built; :func:`mute_module` (and :func:`mute_position_embeddings`) make a part of the
model contribute nothing while its weights stay loadable (docs/design.md, "Adding a fourth method").
"""

from .attention import AttentionCall, AttentionMethod, HeadAttnContext, HeadIndex, key_allowed
from .experiment.kit import MethodInputError, MethodKit, MissingDependencyError, Preset
from .hf_compat import init_normal_, init_ones_, init_zeros_
from .model_hooks import is_muted, mute_module, mute_position_embeddings
from .registry import MethodSettings, MethodSpec, register_method, registered_methods, unregister_method
from .settings_checks import allowed_values, check_choice, check_range, resolve_layers

__all__ = [
    "AttentionCall", "AttentionMethod", "HeadAttnContext", "HeadIndex", "MethodInputError", "MethodKit",
    "MethodSettings", "MethodSpec", "MissingDependencyError", "Preset", "allowed_values", "check_choice",
    "check_range", "init_normal_", "init_ones_", "init_zeros_", "is_muted", "key_allowed", "mute_module",
    "mute_position_embeddings", "register_method", "registered_methods", "resolve_layers", "unregister_method",
]
