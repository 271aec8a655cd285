"""The plug-in interface: everything a method kept outside the package needs, from one import path.

A method is a module (docs/method_template.py is a complete one, run by ``tests/test_plugin.py``): a settings
dataclass (:class:`MethodSettings`), an :class:`AttentionMethod` attached to the attention modules it is placed on,
``METHOD = MethodSpec(...)`` naming both, and optionally ``KIT = MethodKit(...)`` for the recipes (its ``--method``
names, presets, model-card line). ``register_method(METHOD)`` at its end registers it; the recipes'
``--method_modules my_pkg.my_method`` or ``--method_modules my_method.py`` (or, in Python, an ``import my_method`` or
:func:`import_method_modules` before ``hf_headattn.commands.train.main()``) brings it in. How a method is built, step by
step: docs/design.md, "Adding a method".

``build(settings, config, module, *, num_heads, head_dim)`` makes the method for one attention module its
``placements`` name: ``num_heads`` is the module's number of heads as the config gives them (methods are built before
the config's ``pruned_heads`` are pruned; pruning then calls :meth:`AttentionMethod.prune_heads`), ``head_dim`` the
size of one head. Both keywords are optional: the model passes each only where ``build`` names it (or takes
``**kwargs``), so a ``build(settings, config, module)`` reads ``module.num_heads`` as before
(:meth:`MethodSpec.make`).

A checkpoint of a model with such a method records its module in ``config.json`` (``headattn_method_modules``:
``{method: module name}``; a file's module name is its file name, never its path). It loads where the module is
imported first (``--method_modules``, or :func:`import_method_modules` / ``import``, then ``from_pretrained`` with
hf_headattn's classes or the Auto classes); without it the config refuses to load, naming the module.
``trust_remote_code=True`` alone cannot load it: the remote code saved beside the weights is the package's, with the
built-in methods only, so hf_headattn must be installed.

What a hook receives (:class:`AttentionCall`): ``query`` (B, H, T, D), ``key`` and ``value`` (B, H, S, D), as
transformers' attention functions get them; ``attention_mask`` None, bool (True = attend) or additive float
(``torch.finfo(dtype).min`` where masked, eager's), broadcastable to (B, H, T, S), or on flex attention a
``BlockMask`` (``call.mask_tensor`` gives it as a bool tensor); ``hidden_states`` (B, T, d_model), the module's
query-side input; ``context`` (:class:`HeadAttnContext`), where loss terms and read-outs are recorded. ``before``
runs before the backend and may change the mask; ``after`` gets the per-head output (B, T, H, D) and returns what
``out_proj`` receives.

What a ``before`` may change, each composing with the other methods' changes (:class:`AttentionCall`):
``call.add_score_bias(bias, allowed=, heads=)`` (a bias or hard mask on some heads' scores, every backend),
``call.add_score_mod(score_mod)`` (flex attention only), ``call.take_over(heads, attend)`` (those heads computed by
the method; :func:`attention_probabilities` is the scores -> mask -> softmax an ``attend`` needs), and
``call.mix_scores(matrix)`` / ``call.mix_weights(matrix)`` ((H, H) mixings of the heads' scores before the softmax
and of their weights after it, as talking-heads attention; the other methods' score biases and the mask then apply
to the mixed scores, and the call computes every head's probabilities itself, on every backend).

Positions: ``call.query_positions`` (T,) (or (B, T)), ``call.key_positions`` (S,) and ``call.relative_positions``
(j - i, (T, S) or (B, T, S)) are the tokens' positions in their sequences, right under a key/value cache, dynamic or
static (the queries of a generation step are not the last T keys of a static cache): a bias that is any function of
(j - i) is right in ``generate`` (:mod:`hf_headattn.positions`).

Parameters: ``init_weights(std)`` sets them with :func:`init_normal_`, :func:`init_zeros_`, :func:`init_ones_`,
:func:`init_values_` (any values, broadcast) or :func:`init_identity_` (a square matrix), which all leave a
parameter loaded from a checkpoint alone.

The spec: only ``MethodSpec(NAME, Settings, build=build)`` is required. ``placements`` defaults to
:func:`layer_placements` (the settings' fields ``encoder_layers``, ``decoder_layers``, ``cross_layers``, those it
has; None or "all": every layer of that stack, indices, ``[]``: none), ``collect`` to no output fields and no
objective term.

Head masks (:mod:`hf_headattn.head_masks`): ``call.head_mask`` is None or (1 or B, H), one row per sentence, its H the
module's current heads (fewer once pruned), each value m_h in [0, 1] the share of head h that is kept. ``after``
receives the per-head output already scaled by it (``m_h * O_h``). A method follows the same rules as the built-in
ones, so that m_h = 0 gives exactly what pruning head h gives: where it sums, averages or normalises over heads it
weighs head h by m_h (:func:`masked_logits` for a softmax over heads); where it counts heads it counts those with
m_h > 0 (:func:`live_heads`); per-head state of a pruned head is dropped in :meth:`AttentionMethod.prune_heads`
(``keep``: the current numbers of the heads kept). ``docs/method_template.py``'s penalty is such a weighted mean.

A method that takes over heads, fixes their weights, recomputes their probabilities or mixes them
(``HeadUse(mixes=...)``: no method may then take a head over on that module, nor read the mixed heads' probabilities)
declares it (``MethodSpec(head_use=...)`` returning a :class:`HeadUse`), so that the config refuses a method it
cannot meet on one layer when it is built. A change outside attention is ``MethodSpec(prepare_stack=...)``, run once
per stack the method is placed on when the model is built; :func:`mute_module` (and :func:`mute_position_embeddings`)
make a part of the model contribute nothing while its weights stay loadable (docs/design.md, "Adding a
method").
"""

from .attention import AttentionCall, AttentionMethod, HeadAttnContext, HeadIndex, key_allowed
from .experiment.kit import MethodInputError, MethodKit, MissingDependencyError, Preset
from .head_masks import live_heads, masked_logits
from .hf_compat import init_identity_, init_normal_, init_ones_, init_values_, init_zeros_
from .model_hooks import is_muted, mute_module, mute_position_embeddings
from .positions import relative_positions
from .probabilities import attention_probabilities, mix_heads
from .registry import (
    HeadUse,
    MethodSettings,
    MethodSpec,
    import_method_modules,
    register_method,
    registered_methods,
    unregister_method,
)
from .settings_checks import allowed_values, check_choice, check_range, layer_placements, resolve_layers

__all__ = [
    "AttentionCall", "AttentionMethod", "HeadAttnContext", "HeadIndex", "HeadUse", "MethodInputError", "MethodKit",
    "MethodSettings", "MethodSpec", "MissingDependencyError", "Preset", "allowed_values", "attention_probabilities",
    "check_choice", "check_range", "import_method_modules", "init_identity_", "init_normal_", "init_ones_",
    "init_values_", "init_zeros_", "is_muted", "key_allowed", "layer_placements", "live_heads", "masked_logits",
    "mix_heads", "mute_module", "mute_position_embeddings", "register_method", "registered_methods",
    "relative_positions", "resolve_layers", "unregister_method",
]
