"""The built-in methods, one folder each (`methods/<name>/`, its README lists its files), one registration line each
here. How to add a method: docs/design.md, "Adding a method".
"""

# (``from .module import ...``, not ``from . import module``: the remote code is written from that form)
from ..registry import register_method
from .dhicm.core import METHOD as DHICM
from .eadra.core import METHOD as EADRA
from .fixed_attention.core import METHOD as FIXED_ATTENTION
from .localness.core import METHOD as LOCALNESS
from .rel_pos.core import METHOD as REL_POS
from .sea.core import METHOD as SEA

register_method(SEA)
register_method(EADRA)
register_method(DHICM)
register_method(LOCALNESS)
register_method(REL_POS)
register_method(FIXED_ATTENTION)
