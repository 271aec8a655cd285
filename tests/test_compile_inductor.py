"""Inductor (code generation, C++ on the CPU) on every method at once: the checks of test_compile.py's whole-model
compile, which uses ``aot_eager``. A module of its own so that pytest-xdist runs it beside those: its C++ compiles are
the suite's longest test (about 1.5 CPU-minutes with an empty Inductor cache, without SIMD)."""

import pytest

from test_compile import assert_equal_steps, compiled_steps

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("scalar_inductor")]  # (conftest: no SIMD)


def test_inductor_compiles_every_method_at_once():
    results, graphs, breaks = compiled_steps("all", regional=False, steps=2, backend="inductor")
    assert breaks == 0 and graphs[-1] == graphs[0]
    assert_equal_steps(results)
