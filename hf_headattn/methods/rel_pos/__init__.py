"""Relative position representations (Shaw et al. 2018), optionally on RHE's redundant heads: one folder (README.md
lists its files).

The model side (`core`, `equations`) is what the model and a checkpoint's remote code import; the kit
(`kit`) only the recipes do. Importing this package imports neither.
"""
