"""SEA + RHE (Zhang et al. 2021): syntax-enhanced attention on redundant heads, one folder (README.md lists its files).

The model side (`core`, `equations`) is what the model and a checkpoint's remote code import; the kit
(`kit`, `analysis`) only the recipes do; its inputs (the parses, the dependency mask, the phrase
positions) come from the shared input provider `hf_headattn.syntax_inputs`. Importing this package imports
neither.
"""
