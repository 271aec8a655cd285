"""SEA + RHE (Zhang et al. 2021): syntax-enhanced attention on redundant heads, one folder (README.md lists its files).

The model side (:mod:`.core`, :mod:`.equations`) is what the model and a checkpoint's remote code import; the kit
(:mod:`.kit`, :mod:`.inputs`, :mod:`.analysis`, the syntax pipeline :mod:`.syntax`) only the recipes do. Importing
this package imports neither.
"""
