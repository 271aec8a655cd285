"""The experiment kit: data, tokenization, evaluation, presets, the training recipe, the trainer, ``translate``; the
methods' kits (:mod:`.kit`). It imports the model core, never the reverse (docs/design.md, "Two layers")."""
