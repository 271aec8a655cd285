"""Stand-in for transformers' tests/generation/test_utils.py, which the sdist does not ship.

Only the name is needed (``test_modeling_common`` imports it); no generate() tests come from HF here. Our own tests
cover generate() (tests/test_hf_common.py::test_generate_*, tests/methods/sea/test_sea.py, tests/methods/dhicm/test_dhicm.py).
"""


class GenerationTesterMixin:
    """Empty: HF's generate() test mixin is not vendored."""
