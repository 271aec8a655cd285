"""EaDRA (Araabi, Niculae & Monz): entropy- and distance-regularized attention, one folder (README.md lists its files).

The model side (`core`, `equations`, `passes`, `compiled`) is what the model and a
checkpoint's remote code import; the kit (`kit`, `analysis`) only the recipes do. Importing this package
imports neither.
"""
