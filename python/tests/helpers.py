"""Shared helpers of the Python tests: seeds and closeness checks that name
the first mismatching index and both values."""
import os

import numpy as np


def base_seed(default=1234):
    """SEQPACK_TEST_SEED replays a failing random test (the seed is in its id/message)."""
    return int(os.environ.get("SEQPACK_TEST_SEED", default))


def assert_close(actual, expected, rtol, atol, what=""):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bad = ~(np.abs(actual - expected) <= atol + rtol * np.abs(expected))
    if bad.any():
        i = np.unravel_index(np.argmax(bad), bad.shape)
        raise AssertionError(f"{what}: {bad.sum()} of {bad.size} elements differ; first at "
                             f"{tuple(int(k) for k in i)}: {actual[i]!r} vs expected "
                             f"{expected[i]!r} (rtol={rtol}, atol={atol})")
