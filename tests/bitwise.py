"""One assertion the KDA tests share: two output tuples equal bit for bit (NaN where NaN)."""

import torch


def assert_bitwise_equal(a, b) -> None:
    """``a`` and ``b`` hold the same entries, None in the same places, equal tensors bitwise."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
