"""trainer/numeric.py on hand cases."""
from __future__ import annotations

import math

import pytest

from trainer.numeric import t_statistic


def test_t_statistic_of_fold_pnls():
    assert t_statistic([1.0, 2.0, 3.0]) == pytest.approx(2.0 / (1.0 / math.sqrt(3)))
    assert t_statistic([5.0]) is None
    assert t_statistic([2.0, 2.0]) is None
