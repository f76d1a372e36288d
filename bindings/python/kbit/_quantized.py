"""What every quantized-tensor container shares (kbit, NF4/FP4)."""
from __future__ import annotations

import numpy as np

from . import _arrays


class QuantizedBase:
    """Mixin for dataclasses with `packed`, `shape` and an `nbytes` property."""

    @property
    def n(self) -> int:
        """Number of elements of the original tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def on_device(self) -> bool:
        return _arrays.device_view(self.packed) is not None

    @property
    def bits_per_element(self) -> float:
        """Storage (codes plus scales) per element of the original tensor."""
        return self.nbytes * 8 / max(self.n, 1)
