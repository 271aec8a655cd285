"""Which registered methods compose on one attention module: the table in docs/design.md ("Two methods on one
attention module"), generated from the registry (`tests/test_docs.py` checks that the file holds this output).

Each method is taken with the settings of its recipe name (`--method <name>`: its kit's `method_names`, the
entry named after the method, else its first), on one encoder self-attention layer of Transformer-base (8 heads);
a pair is refused when the config is built where their declared head uses conflict
(`meeting_conflict`: both take over a head, or one reads the probabilities of heads the
other fixes), and composes otherwise.
"""

from __future__ import annotations

import textwrap

from ..configuration import HeadAttnMarianConfig
from ..registry import HeadUse, meeting_conflict, registered_methods
from ..sites import AttentionSite
from .kit import kits
from .presets import MODEL_SHAPES

SITE = AttentionSite("encoder", 0, "self")
"""The attention module the table places every pair on."""
BEGIN = "<!-- compatibility table: hf_headattn.experiment.compatibility.compatibility_table() -->"
"""The markers around the table in docs/design.md."""
END = "<!-- end of the compatibility table -->"


def recipe_settings() -> dict[str, tuple[str, dict]]:
    """`{method: (recipe name, its settings)}` for every registered method whose kit has a recipe name."""
    chosen = {}
    for kit in kits():
        names = kit.method_names
        if names:
            name = kit.name if kit.name in names else next(iter(names))
            chosen[kit.name] = (name, names[name])
    return chosen


def head_uses(config) -> dict[str, HeadUse]:
    """Each method's [`HeadUse`][hf_headattn.registry.HeadUse] on `SITE` with its recipe settings (an empty one: no
    declaration)."""
    uses = {}
    for spec in registered_methods():
        recipe = recipe_settings().get(spec.name)
        if recipe is None:
            continue
        settings = spec.settings.from_dict(recipe[1], spec.name, config)
        uses[spec.name] = HeadUse() if spec.head_use is None else spec.head_use(settings, config, SITE)
    return uses


def compatibility_table() -> str:
    """The markdown table (between `BEGIN` and `END`) and the refusals' messages."""
    config = HeadAttnMarianConfig(**MODEL_SHAPES["base"])
    uses = head_uses(config)
    names = list(uses)
    recipes = recipe_settings()
    lines = [BEGIN, "", "| | " + " | ".join(f"`{name}`" for name in names) + " |",
             "|---|" + "---|" * len(names)]
    refusals = []
    for first in names:
        cells = []
        for second in names:
            if first == second:
                cells.append("")
                continue
            reason = meeting_conflict(first, uses[first], second, uses[second], SITE.name)
            cells.append("composes" if reason is None else "**refused**")
            if reason is not None and names.index(first) < names.index(second):
                refusals.append(textwrap.fill(f"- `{recipes[first][0]}+{recipes[second][0]}`: {reason}.", 120,
                                              subsequent_indent="  ", break_on_hyphens=False))
        lines.append(f"| `{first}` | " + " | ".join(cells) + " |")
    settings = ", ".join(f"`{name}` as `--method {recipes[name][0]}`" for name in names)
    text = (f"Each method with its recipe settings ({settings}), on one encoder self-attention layer of "
            "Transformer-base (8 heads). The refusals (a `ValueError` when the config is built, a usage error in the "
            "commands):")
    lines += ["", textwrap.fill(text, 120, break_on_hyphens=False), "", *refusals, "", END]
    return "\n".join(lines)
