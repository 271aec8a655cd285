"""Localness (Yang et al. 2018): a learned Gaussian bias on the scores of the lower encoder self-attention layers, on
every head or, with RHE (Zhang et al. 2021), on the redundant ones; one folder (README.md lists its files).

The model side (`core`, `equations`) is what the model and a checkpoint's remote code import; the kit
(`kit`) only the recipes do. Importing this package imports neither.
"""
