"""The built-in methods' kits, one folder each: ``<name>/__init__.py`` holds ``KIT`` (its recipe names, the papers'
presets, the model card's line, its head-importance criterion); ``<name>/analysis.py`` its
read-outs over a dataset; SEA's folder also holds the hooks that make its inputs (``sea/inputs.py``) and its
syntax pipeline (``sea/syntax``).

Each method's core (``hf_headattn/<name>.py``: settings, placements, hooks, loss) stays flat beside the model: the
Hub's remote code (``save_pretrained`` copies ``modeling.py``, ``configuration.py`` and what they import relatively
into one folder) has no packages. The core's ``MethodSpec.kit`` names its folder here.
"""
