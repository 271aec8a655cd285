"""The experiment kit: data, tokenization, evaluation, presets, the commands' modules (:mod:`hf_headattn.cli`: the
training recipe and six others), the trainer, ``translate``; the methods' kits (:mod:`.kit`). It imports the model
core, never the reverse (docs/design.md, "Two layers")."""
