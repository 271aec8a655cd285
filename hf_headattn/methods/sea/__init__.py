"""SEA + RHE (Zhang et al. 2021): syntax-enhanced attention on redundant heads, one folder (README.md lists its files).

The model side (:mod:`.core`, :mod:`.equations`) is what the model and a checkpoint's remote code import; the kit
(:mod:`.kit`, :mod:`.analysis`) only the recipes do; its inputs (the parses, the dependency mask, the phrase
positions) come from the shared input provider :mod:`hf_headattn.syntax_inputs`. Importing this package imports
neither.
"""
