"""`njit`: numba's JIT when numba is installed, else the plain Python function (same results, much slower).

The sequential kernels (MBO book rebuild, OFI, synthetic market) are numba-compiled. Importing them must not
require numba, so a GPU image without it can still load cached features and train; building features there
without numba works too, only slowly.
"""
from __future__ import annotations

try:
    from numba import njit
except ImportError:  # pragma: no cover - exercised only on machines without numba

    def njit(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda func: func


__all__ = ["njit"]
