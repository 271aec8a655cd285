"""EaDRA (Araabi, Niculae & Monz): entropy- and distance-regularized attention, one folder (README.md lists its files).

The model side (:mod:`.core`, :mod:`.equations`, :mod:`.passes`, :mod:`.compiled`) is what the model and a
checkpoint's remote code import; the kit (:mod:`.kit`, :mod:`.analysis`) only the recipes do. Importing this package
imports neither.
"""
