"""Assertions on torch tensors shared by the torch test files (torch imported by the caller's
importorskip first; nothing here imports it at module level)."""


def assert_same(a, b):
    """a and b equal bit for bit (tensors, or tuples of them): same shape, dtype and values."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    import torch
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max().item()}"
