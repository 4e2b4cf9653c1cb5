"""Which scan core runs: the compiled one (walcore._scan, C) or the pure-Python reference walks.

The compiled core takes the hot loops (Tarantool blocks and rows, limestone pwal entries) over well-formed
data and hands anything out of the ordinary back to the reference walk, which decides it: so both cores give
the same findings, offsets and messages. The reference runs when the extension is not built, or when
WALVAULT_PURE=1 (read at each call, so tests can switch).
"""

from __future__ import annotations

import os

try:
    from . import _scan as _built
except ImportError:  # built without a C compiler: the reference walks do all the work
    _built = None


def compiled():
    """The compiled module, or None when the reference walks must run."""
    if _built is None or os.environ.get("WALVAULT_PURE") == "1":
        return None
    return _built


def describe() -> str:
    """The scan core in use, in words, for `walvault --version` and `inspect`."""
    if _built is None:
        return "pure Python (the compiled scan core walcore._scan is not built)"
    if os.environ.get("WALVAULT_PURE") == "1":
        return "pure Python (WALVAULT_PURE=1)"
    return "compiled (walcore._scan)"
