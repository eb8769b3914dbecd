"""tests/support/runs.py's comparison of two sets of weights, which every resume test trusts:
it fails on one differing bit or name, and says which."""

from __future__ import annotations

import pytest
import torch
from support.runs import assert_same_weights


def test_same_weights_pass_and_one_differing_bit_or_name_fails_naming_it() -> None:
    a = {"wte.weight": torch.arange(6.0).reshape(2, 3), "lm_head.bias": torch.zeros(3)}
    assert_same_weights({k: v.clone() for k, v in a.items()}, a)
    off = {**a, "lm_head.bias": torch.tensor([0.0, 0.0, torch.finfo(torch.float32).tiny])}
    with pytest.raises(AssertionError, match="resumed: lm_head.bias differs"):
        assert_same_weights(off, a, "resumed")
    with pytest.raises(AssertionError, match=r"names differ: \['lm_head.bias'\]"):
        assert_same_weights({"wte.weight": a["wte.weight"]}, a)
