"""What every quantized-tensor container shares (kbit, NF4/FP4, GGUF)."""
from __future__ import annotations

import numpy as np

from . import _arrays


class QuantizedBase:
    """Mixin for dataclasses with `shape`, an `nbytes` property and the array named by
    _DATA (`packed` unless a container says otherwise), which decides where it lives."""

    _DATA = "packed"

    @property
    def n(self) -> int:
        """Number of elements of the original tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def on_device(self) -> bool:
        return _arrays.device_view(getattr(self, self._DATA)) is not None

    @property
    def bits_per_element(self) -> float:
        """Storage (codes plus scales) per element of the original tensor."""
        return self.nbytes * 8 / max(self.n, 1)
