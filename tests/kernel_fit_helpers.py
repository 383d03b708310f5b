"""What the kernel-fit tests share (tests/test_calibrated.py, tests/test_a100_h100_fit.py): the
check that a fresh fit predicts what the committed table does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from harness.app.kernel_samples import Samples
from harness.core.kernel_model import KernelModel

#: how closely a fresh fit must give the committed table's times: the least-squares solver stops
#: when a step changes the cost by less than 1e-8 of it (scipy's ``ftol``), which leaves the
#: parameters free to move by about its square root (1e-4) along flat directions of the cost, and
#: differently on another CPU or BLAS build (a V100 GEMM fit's t0 moved by 3e-6 between two
#: x86-64 machines) - the fitted times move far less than that, the parameters' digits do not
#: mean anything beyond it
PRED_RTOL = 1e-3
#: the held-out error of a fresh fit may differ from the committed one by this much (absolute: 0.5
#: percentage points)
ERROR_ABS = 0.005


def assert_same_fit(fresh: KernelModel, committed: dict[str, Any], s: Samples, peak: float, test: np.ndarray, what: str) -> None:
    """A fresh fit predicts what the committed one does, on every measured kernel (training and
    held-out), and its held-out median error is the committed one's."""
    ref = KernelModel.from_dict(committed)
    got, want = s.predict(fresh, peak), s.predict(ref, peak)
    np.testing.assert_allclose(got, want, rtol=PRED_RTOL, err_msg=what)
    if len(test):
        err = float(np.median(np.abs(got[test] / s.time_s[test] - 1)))
        assert err == pytest.approx(committed["test_median_abs_error"], abs=ERROR_ABS), what
