"""Fixed attention (Raganato, Scherrer & Tiedemann 2020): fixed, token-independent patterns on some heads, one
folder (README.md lists its files).

The model side (`core`: settings, the attached module; `equations`: the patterns) is what the model and a
checkpoint's remote code import; the kit (`kit`) only the recipes do. Importing this package imports neither.
"""
