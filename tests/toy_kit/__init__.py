"""The toy method's kit (its core: ``tests/toy_method.py``): a recipe name, a paper-style preset, a head-importance
criterion and the hooks that make its own input (:mod:`.inputs`); :mod:`.analysis` reads the scales out over a
dataset."""

from hf_headattn.experiment.kit import MethodKit, Preset

from . import inputs


def scale_sums(scales: dict) -> dict:
    """The ``toy_scale`` criterion: per module, |scale| per head, counted once per batch."""
    return {name: (scale.abs(), 1) for name, scale in scales.items()}


KIT = MethodKit(
    "toy",
    paper="A toy head-scaling method (tests only)",
    method_names={"toy": {"encoder_layers": [-1]}},
    presets={"toy_table_1": Preset(doc="Toy paper, Table 1: lr 1e-3, weight 0.25", flags={"learning_rate": 1e-3},
                                   method_overrides={"toy": {"weight": 0.25}})},
    importance=("toy_scale", scale_sums),
    columns=("toy_gate",),
    recipe_arguments=inputs.ToyArguments,
    prepare_features=inputs.prepare_features,
    collate=inputs.collate,
    inference_inputs=inputs.inference_inputs,
    example_inputs=inputs.example_inputs,
)
