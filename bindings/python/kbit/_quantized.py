"""What every quantized-tensor container shares (kbit, NF4/FP4, GGUF)."""
from __future__ import annotations


from . import _arrays
from ._lib import KbitError


class QuantizedBase:
    """Mixin for dataclasses with `shape`, an `nbytes` property and the array named by
    _DATA (`packed` unless a container says otherwise), which decides where it lives."""

    _DATA = "packed"

    @property
    def n(self) -> int:
        """Number of elements of the original tensor. A shape that is not a sequence of
        non-negative integers, or whose product passes 2^62 (where np.prod would wrap
        around), is a KbitError: a tampered container must not read as a small tensor."""
        shape = self.shape
        if not isinstance(shape, (tuple, list)):
            raise KbitError(f"shape must be a tuple of integers, got {shape!r}")
        n = 1
        for d in shape:
            if not _arrays.is_integer(d) or int(d) < 0:
                raise KbitError(f"shape must hold non-negative integers, got {tuple(shape)!r}")
            n *= int(d)
            if n > 1 << 62:
                raise KbitError(f"shape {tuple(shape)!r} has more than 2^62 elements")
        return n

    @property
    def total_nbytes(self) -> int:
        """Everything stored for this tensor: nbytes, plus what a container keeps beside
        its arrays (a kbit tensor's custom codebook)."""
        return self.nbytes

    @property
    def on_device(self) -> bool:
        return _arrays.device_view(getattr(self, self._DATA)) is not None

    @property
    def bits_per_element(self) -> float:
        """Storage (codes plus scales) per element of the original tensor."""
        return self.nbytes * 8 / max(self.n, 1)
