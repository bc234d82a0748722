"""numba jit code only; the launchers are kernels/cpu/decode.py, kernels/cpu/pack.py and kernels/cpu/step.py. Importing these modules
needs numba (contract.py excepted); nothing else in `kernels` does.

numba's on-disk cache (cache=True) stamps a compiled function with the hash of the one file that defines it, but the
functions here inline helpers from the package's other files (fields.py, rows.py, flat.py...): after an edit to a
helper, a kernel loaded from the cache would run the old helper, with no error. So every function of this package is
stamped with one hash of all the package's files (`package_stamp`), and an edit anywhere here recompiles them all.

This is the one place kvviz reaches into numba's internals (`numba.core.caching.CacheImpl._locator_classes`; the
README says why): numba has no per-package hook for a function's source stamp, and its NUMBA_CACHE_LOCATOR_CLASSES
setting is process-wide, read from the environment, and would replace the locators of every other numba user too.
The locators added here claim this package's files only; every other function keeps numba's own.
"""

from __future__ import annotations

import hashlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def package_stamp(folder: str = _HERE) -> str:
    """sha256 over the names and bytes of the .py files in `folder` (this package by default)."""
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


def _stamp_cached_functions() -> None:
    """Put locators in front of numba's that claim this package's files and stamp them with package_stamp(); the
    cache directories stay numba's (NUMBA_CACHE_DIR, else __pycache__ here, else the user-wide one)."""
    try:
        from numba.core import caching
    except ImportError:  # no numba: only contract.py is imported
        return
    stamp = package_stamp()

    class _PackageStamped:
        def get_source_stamp(self):
            return stamp

        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.dirname(os.path.abspath(py_file)) != _HERE:
                return None  # another package's function: numba's own locators
            return super().from_function(py_func, py_file)

    bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
    ours = [type(f"PackageStamped{base.__name__}", (_PackageStamped, base), {}) for base in bases]
    caching.CacheImpl._locator_classes[:0] = ours


_stamp_cached_functions()
