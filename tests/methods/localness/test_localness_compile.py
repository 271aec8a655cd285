"""Localness under torch.compile (tests/test_compile.py's checks): no graph break, batches of varying lengths compile
once more at most (the second batch makes the lengths dynamic), and each step's loss and gradients equal eager's;
alone and with SEA+RHE on the same layer (one RHE selection, both biases)."""

import pytest

from test_compile import assert_equal_steps, varying_length_steps

pytestmark = pytest.mark.slow  # every test compiles

#: one case (about 20 s on a CPU core): Localness+RHE beside LPEA+RHE covers Localness's bias path, its RHE selection
#: and the selection shared with SEA
CASES = {"localness-rhe+lpea-rhe": {"localness": {"head_selection": "redundant"}, "sea": {"type": "lpea"}}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_varying_lengths_compile_once_more_at_most_without_breaks(name):
    results, graphs, breaks = varying_length_steps(CASES[name])
    assert breaks == 0
    assert graphs[1] <= graphs[0] + 1 and graphs[-1] == graphs[1], graphs
    assert_equal_steps(results)
