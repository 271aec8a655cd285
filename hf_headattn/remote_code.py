"""What a checkpoint's remote code carries: the modules ``save_pretrained`` copies for ``trust_remote_code`` and the
``auto_map`` that names them.

transformers ships the module that defines each class registered for an Auto class and, recursively, the modules it
imports relatively (a ``from .x import`` line anywhere in its text), and its loader fetches the same set, starting
from the module ``auto_map`` names. Settings that need code the model does not import (EaDRA's Triton kernels,
imported by name only when chosen, :mod:`.eadra_passes`) name a module that imports the model classes and that code
(``MethodSpec.model_module``, e.g. ``modeling_eadra_triton``): a config whose settings do so points ``auto_map``'s
model classes at it (:func:`auto_map`, from the config's ``to_dict``), and its ``save_pretrained`` copies it and what
it imports beside ``modeling.py`` (:func:`ship`). The other checkpoints carry neither.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .hf_compat import get_relative_import_files
from .registry import active_methods

#: The module of the model classes (``modeling.py``); a method's model module is named ``modeling_<...>``.
MODEL_MODULE = "modeling"


def model_module(config) -> str:
    """The module a checkpoint's ``auto_map`` names for the model classes: :data:`MODEL_MODULE`, or the one the
    switched-on methods' settings ask for (``MethodSpec.model_module``); two different ones are refused."""
    settings = getattr(config, "headattn_settings", {})
    asked = {spec.name: spec.model_module(settings[spec.name]) for spec in active_methods(config) if spec.model_module}
    modules = {module for module in asked.values() if module}
    if len(modules) > 1:
        raise ValueError(f"the methods' settings ask for different model modules in the checkpoint's remote code "
                         f"({asked}); expected one at most")
    return modules.pop() if modules else MODEL_MODULE


def auto_map(config, entries: dict) -> dict:
    """``entries`` (a config's ``auto_map``) with each model class (``"modeling....<class>"``) in
    :func:`model_module`."""
    module = model_module(config)

    def moved(value):
        if isinstance(value, str) and value.partition(".")[0].startswith(MODEL_MODULE):
            return f"{module}.{value.rpartition('.')[2]}"
        return value

    return {auto_class: moved(value) for auto_class, value in entries.items()}


def ship(config, folder) -> list[Path]:
    """Copy :func:`model_module` and the modules it imports relatively into ``folder`` when it is not
    :data:`MODEL_MODULE` and ``folder`` holds the model's code (``modeling.py``, which ``save_pretrained`` copies
    before it saves the config); the copied files. Another model module an earlier save left in ``folder`` is removed
    first (:func:`remove_stale`)."""
    folder, module = Path(folder), model_module(config)
    if not (folder / f"{MODEL_MODULE}.py").is_file():
        return []
    remove_stale(folder, module)
    if module == MODEL_MODULE:
        return []
    source = Path(__file__).with_name(f"{module}.py")
    if not source.is_file():  # e.g. a checkpoint's own configuration.py, loaded without its model module
        raise FileNotFoundError(f"the settings need {source.name} in the checkpoint's remote code, and this copy of "
                                f"the code ({source.parent}) lacks it; expected hf_headattn installed to save it")
    files = [source, *map(Path, get_relative_import_files(source))]
    for file in files:
        shutil.copyfile(file, folder / file.name)
    return [folder / file.name for file in files]


def remove_stale(folder: Path, module: str) -> list[Path]:
    """Remove from ``folder`` the model modules (``modeling_<...>.py``) other than ``module`` that an earlier save of
    another config wrote there, and the files only they import, so that a folder re-saved without the Triton pass,
    then pushed, carries no kernels its ``auto_map`` never names; the removed files. Only files equal to this copy
    of the code are removed: a file of the user's own, or edited, stays."""
    ours = Path(__file__).parent
    if not (ours / f"{module}.py").is_file() or folder.resolve() == ours.resolve():
        return []  # (ship names the missing module)

    def same(name: str) -> bool:
        return (ours / name).is_file() and (folder / name).read_bytes() == (ours / name).read_bytes()

    stales = [stale for stale in sorted(folder.glob(f"{MODEL_MODULE}_*.py"))
              if stale.name != f"{module}.py" and same(stale.name)]
    if not stales:  # (the usual save: no import graph is read)
        return []
    needed = {Path(file).name for file in get_relative_import_files(ours / f"{module}.py")} | {f"{module}.py"}
    needed |= {Path(file).name for file in get_relative_import_files(ours / f"{MODEL_MODULE}.py")}
    removed = []
    for stale in stales:
        for name in [stale.name, *(Path(file).name for file in get_relative_import_files(ours / stale.name))]:
            if name not in needed and (folder / name).is_file() and same(name):
                (folder / name).unlink()
                removed.append(folder / name)
    return removed
