"""The plug-in interface: everything a method kept outside the package needs, from one import path.

A method is a module (docs/method_template.py is a complete one, run by `tests/test_plugin.py`): a settings
dataclass ([`MethodSettings`][hf_headattn.registry.MethodSettings]), an
[`AttentionMethod`][hf_headattn.attention.AttentionMethod] attached to the attention modules it is placed on,
`METHOD = MethodSpec(...)` naming both, and optionally `KIT = MethodKit(...)` for the recipes (its `--method` names,
presets, model-card line). `register_method(METHOD)` at its end registers it; the recipes'
`--method_modules my_pkg.my_method` or `--method_modules my_method.py` (or, in Python, an `import my_method` or
[`import_method_modules`][hf_headattn.registry.import_method_modules] before `hf_headattn.commands.train.main()`) brings
it in. How a method is built, step by step: docs/design.md, "Adding a method".

`build(settings, config, module, *, num_heads, head_dim)` makes the method for one attention module its
`placements` name: `num_heads` is the module's number of heads as the config gives them (methods are built before
the config's `pruned_heads` are pruned; pruning then calls
[`AttentionMethod.prune_heads`][hf_headattn.attention.AttentionMethod.prune_heads]), `head_dim` the size of one head.
Both keywords are optional: the model passes each only where `build` names it (or takes `**kwargs`), so a
`build(settings, config, module)` reads `module.num_heads` as before
([`MethodSpec.make`][hf_headattn.registry.MethodSpec.make]).

A checkpoint of a model with such a method records its module in `config.json` (`headattn_method_modules`:
`{method: module name}`; a file's module name is its file name, never its path). It loads where the module is
imported first (`--method_modules`, or [`import_method_modules`][hf_headattn.registry.import_method_modules] / `import`,
then `from_pretrained` with hf_headattn's classes or the Auto classes); without it the config refuses to load, naming
the module. `trust_remote_code=True` alone cannot load it: the remote code saved beside the weights is the package's,
with the built-in methods only, so hf_headattn must be installed.

What a hook receives ([`AttentionCall`][hf_headattn.attention_call.AttentionCall]): `query` (B, H, T, D), `key` and
`value` (B, H, S, D), as transformers' attention functions get them; `attention_mask` None, bool (True = attend) or
additive float (`torch.finfo(dtype).min` where masked, eager's), broadcastable to (B, H, T, S), or on flex attention a
`BlockMask` (`call.mask_tensor` gives it as a bool tensor); `hidden_states` (B, T, d_model), the module's
query-side input; `context` ([`HeadAttnContext`][hf_headattn.context.HeadAttnContext]), where loss terms and read-outs
are recorded. `before` runs before the backend and may change the mask; `after` gets the per-head output (B, T, H, D)
and returns what `out_proj` receives.

What a `before` may change, each composing with the other methods' changes
([`AttentionCall`][hf_headattn.attention_call.AttentionCall]): `call.add_score_bias(bias, allowed=, heads=)` (a bias or
hard mask on some heads' scores, every backend), `call.add_score_mod(score_mod)` (flex attention only),
`call.take_over(heads, attend)` (those heads computed by the method;
[`attention_probabilities`][hf_headattn.probabilities.attention_probabilities] is the scores -> mask -> softmax an
`attend` needs), and `call.mix_scores(matrix)` / `call.mix_weights(matrix)` ((H, H) mixings of the heads' scores before
the softmax and of their weights after it, as talking-heads attention; the other methods' score biases and the mask then
apply to the mixed scores, and the call computes every head's probabilities itself, on every backend).

Positions: `call.query_positions` (T,) (or (B, T)), `call.key_positions` (S,) and `call.relative_positions`
(j - i, (T, S) or (B, T, S)) are the tokens' positions in their sequences, right under a key/value cache, dynamic or
static (the queries of a generation step are not the last T keys of a static cache): a bias that is any function of
(j - i) is right in `generate` (`hf_headattn.positions`).

Parameters: `init_weights(std)` sets them with `init_normal_`, `init_zeros_`, `init_ones_`,
[`init_values_`][hf_headattn.hf_compat.init_values_] (any values, broadcast) or
[`init_identity_`][hf_headattn.hf_compat.init_identity_] (a square matrix), which all leave a parameter loaded from a
checkpoint alone.

The spec: only `MethodSpec(NAME, Settings, build=build)` is required. `placements` defaults to
[`layer_placements`][hf_headattn.placement.layer_placements] (the settings' layer fields, those it has), `collect` to no
output fields and no objective term.

Placements: one vocabulary for every method (`hf_headattn.placement`; a method has the fields it supports):

| field | values | meaning |
|---|---|---|
| `encoder_layers` | `"all"`, layer numbers (negative from the end), None | encoder self-attention, None: none |
| `decoder_layers` | the same | decoder self-attention |
| `cross_layers` | the same | decoder cross-attention |
| `heads` | `"all"`, head numbers (negative from the end) | which heads of a placed module |
| `head_selection` | `"all"`, `"redundant"` | all of them or, per sentence, the ones RHE finds redundant |

[`layers_of`][hf_headattn.placement.layers_of] and [`heads_of`][hf_headattn.placement.heads_of] read them (a method's
own named layouts too, e.g. Localness's `"lower_half"`), with errors naming the field, the value and what was expected;
`MethodSpec.older_spellings` (with [`renamed`][hf_headattn.placement.renamed]) reads a method's earlier spellings, which
the config warns about.

Head masks ([`hf_headattn.head_masks`][hf_headattn.head_masks]): `call.head_mask` is None or (1 or B, H), one row per
sentence, its H the module's current heads (fewer once pruned), each value m_h in [0, 1] the share of head h that is
kept. `after` receives the per-head output already scaled by it (`m_h * O_h`). A method follows the same rules as the
built-in ones, so that m_h = 0 gives exactly what pruning head h gives: where it sums, averages or normalises over heads
it weighs head h by m_h ([`masked_logits`][hf_headattn.head_masks.masked_logits] for a softmax over heads); where it
counts heads it counts those with m_h > 0 ([`live_heads`][hf_headattn.head_masks.live_heads]); per-head state of a
pruned head is dropped in [`AttentionMethod.prune_heads`][hf_headattn.attention.AttentionMethod.prune_heads] (`keep`:
the current numbers of the heads kept). `docs/method_template.py`'s penalty is such a weighted mean.

A method that takes over heads, fixes their weights, recomputes their probabilities or mixes them
(`HeadUse(mixes=...)`: no method may then take a head over on that module, nor read the mixed heads' probabilities)
declares it (`MethodSpec(head_use=...)` returning a [`HeadUse`][hf_headattn.registry.HeadUse]), so that the config
refuses a method it cannot meet on one layer when it is built. A change outside attention is
`MethodSpec(prepare_stack=...)`, run once per stack the method is placed on when the model is built;
[`mute_module`][hf_headattn.model_hooks.mute_module] (and
[`mute_position_embeddings`][hf_headattn.model_hooks.mute_position_embeddings]) make a part of the model contribute
nothing while its weights stay loadable (docs/design.md, "Adding a method").

What the built-in methods use beside (every one of them imports from the package only the names listed here, tested
by `tests/test_architecture.py`; their model code, which a checkpoint carries as flat remote code without this
module, imports each from the module that defines it, their kits and analyses from here):

* attention modules and heads: [`OUTPUT_PROJECTION`][hf_headattn.hf_compat.OUTPUT_PROJECTION] (the name of an attention
module's output projection, for a
  method that replaces it), [`COMPONENTS`][hf_headattn.sites.COMPONENTS] /
  [`COMPONENT_SITES`][hf_headattn.sites.COMPONENT_SITES] ("encoder", "decoder", "cross": their (side, kind)),
  [`component_of`][hf_headattn.sites.component_of] (an attention module's component),
  [`component_shape`][hf_headattn.sites.component_shape] ((layers, heads) of a component in a config);
* tensors: [`softmax_backward`][hf_headattn.hf_compat.softmax_backward] (the gradient through a softmax, for a
hand-written backward),
  [`assert_async`][hf_headattn.hf_compat.assert_async] (fail on the device without synchronising),
  [`constant`][hf_headattn.head_split.constant] (a tuple as a device tensor, made once),
  [`IGNORE_INDEX`][hf_headattn.losses.IGNORE_INDEX] (the label padding value);
* Triton kernels (EaDRA's tiled pass, Rel_Pos's kernels), answered without importing Triton:
  [`triton_installed`][hf_headattn.triton_support.triton_installed] (Triton is installed),
  [`triton_kernel_device`][hf_headattn.triton_support.triton_kernel_device] (CUDA, or the CPU under its interpreter);
* RHE, the redundant heads (Zhang et al. 2021, Eq. 3, 5, 9, 10; `hf_headattn.redundancy`), for a method with
  `head_selection="redundant"`: [`redundant_heads_of`][hf_headattn.redundancy.redundant_heads_of],
  [`dependency_allowed`][hf_headattn.redundancy.dependency_allowed],
  [`checked_dependency_mask`][hf_headattn.redundancy.checked_dependency_mask],
  [`neutral_dependency_mask`][hf_headattn.redundancy.neutral_dependency_mask] (its `neutral_inputs`),
  [`real_tokens`][hf_headattn.redundancy.real_tokens];
* the values of the shared syntax inputs (`hf_headattn.phrase_values`):
[`NOT_IN_PHRASE`][hf_headattn.phrase_values.NOT_IN_PHRASE], the Rule 2
  readings [`Rule2`][hf_headattn.phrase_values.Rule2] (a settings annotation),
  [`RULE2`][hf_headattn.phrase_values.RULE2], [`DEFAULT_RULE2`][hf_headattn.phrase_values.DEFAULT_RULE2];
* the registry's read-outs, for an analysis: [`readout`][hf_headattn.registry.readout] (a spec's read-out flag and
field),
  [`method_inputs`][hf_headattn.registry.method_inputs] (every method's forward inputs),
  [`attention_backend`][hf_headattn.hf_compat.attention_backend] (run a block on another backend);
* for a kit: [`TRANSFORMER_BASE`][hf_headattn.experiment.presets.TRANSFORMER_BASE] (the Transformer-base training flags
a paper's [`Preset`][hf_headattn.experiment.kit.Preset] starts from),
  [`pyplot`][hf_headattn.experiment.plotting.pyplot] / [`save_figure`][hf_headattn.experiment.plotting.save_figure] (an
  analysis's figures), and the shared syntax input provider's hooks (`hf_headattn.syntax_inputs.provider`), which a kit
  whose method reads the parses names: [`needs_syntax`][hf_headattn.syntax_inputs.provider.needs_syntax] /
  [`syntax_for_redundant_heads`][hf_headattn.syntax_inputs.provider.syntax_for_redundant_heads]
  (`MethodKit.inputs_from`) and [`syntax_example_inputs`][hf_headattn.syntax_inputs.provider.example_inputs]
  (`MethodKit.example_inputs`).
"""

from .attention import AttentionCall, AttentionMethod, HeadAttnContext, HeadIndex, constant, key_allowed
from .experiment.kit import MethodInputError, MethodKit, MissingDependencyError, Preset
from .experiment.plotting import pyplot, save_figure
from .experiment.presets import TRANSFORMER_BASE
from .head_masks import live_heads, masked_logits
from .hf_compat import (
    OUTPUT_PROJECTION,
    assert_async,
    attention_backend,
    init_identity_,
    init_normal_,
    init_ones_,
    init_values_,
    init_zeros_,
    softmax_backward,
)
from .losses import IGNORE_INDEX
from .model_hooks import is_muted, mute_module, mute_position_embeddings
from .phrase_values import DEFAULT_RULE2, NOT_IN_PHRASE, RULE2, Rule2
from .placement import HEAD_SELECTIONS, check_head_selection, heads_of, layer_placements, layers_of, renamed
from .positions import relative_positions
from .probabilities import attention_probabilities, mix_heads
from .redundancy import (
    checked_dependency_mask,
    dependency_allowed,
    neutral_dependency_mask,
    real_tokens,
    redundant_heads_of,
)
from .registry import (
    HeadUse,
    MethodSettings,
    MethodSpec,
    import_method_modules,
    method_inputs,
    readout,
    register_method,
    registered_methods,
    unregister_method,
)
from .settings_checks import allowed_values, check_choice, check_range, resolve_layers
from .sites import COMPONENT_SITES, COMPONENTS, component_of, component_shape
from .syntax_inputs.provider import example_inputs as syntax_example_inputs
from .syntax_inputs.provider import needs_syntax, syntax_for_redundant_heads
from .triton_support import triton_installed, triton_kernel_device

__all__ = [
    "HEAD_SELECTIONS", "AttentionCall", "AttentionMethod", "HeadAttnContext", "HeadIndex", "HeadUse",
    "MethodInputError", "MethodKit", "MethodSettings", "MethodSpec", "MissingDependencyError", "Preset",
    "allowed_values", "attention_probabilities", "check_choice", "check_head_selection", "check_range", "heads_of",
    "import_method_modules", "init_identity_", "init_normal_", "init_ones_", "init_values_", "init_zeros_",
    "is_muted", "key_allowed", "layer_placements", "layers_of", "live_heads", "masked_logits", "mix_heads",
    "mute_module", "mute_position_embeddings", "register_method", "registered_methods", "relative_positions",
    "renamed", "resolve_layers", "unregister_method",
    # what the built-in methods use beside (the docstring's last section)
    "COMPONENTS", "COMPONENT_SITES", "DEFAULT_RULE2", "IGNORE_INDEX", "NOT_IN_PHRASE", "OUTPUT_PROJECTION", "RULE2",
    "Rule2", "TRANSFORMER_BASE", "assert_async", "attention_backend", "checked_dependency_mask", "component_of",
    "component_shape", "constant", "dependency_allowed", "method_inputs", "needs_syntax", "neutral_dependency_mask",
    "pyplot", "readout", "real_tokens", "redundant_heads_of", "save_figure", "softmax_backward",
    "syntax_example_inputs", "syntax_for_redundant_heads", "triton_installed", "triton_kernel_device",
]
