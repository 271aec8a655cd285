"""The experiment kit, the library the commands (`hf_headattn.commands`) are built from: data, tokenization,
evaluation, presets, the trainer, `translate`, the analyses (`analysis`: head ranking and pruning); the
methods' kits (`kit`). It imports the model core, never the reverse (docs/design.md, "Two layers")."""
