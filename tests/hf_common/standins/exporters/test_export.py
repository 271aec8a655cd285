"""Stand-in for transformers' tests/exporters/test_export.py, which the sdist does not ship.

``ModelTesterMixin`` inherits ``ExportTesterMixin`` (torch.export tests); it is empty here, so no export tests run.
"""


class ExportTesterMixin:
    """Empty: HF's torch.export test mixin is not vendored."""
