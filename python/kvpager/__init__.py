"""kvpager from Python: KV caches in virtual memory paged from NVMe.

A binding of libkvpager (ctypes; see _native.py for why).  The objects:

  Pager     the paging engine: a RAM budget, tunables as keyword arguments
  Region    virtual memory served from a store, viewed as numpy arrays
  Store     where blocks live when not resident (file, memory, faulty)
  Prefetch  an asynchronous prefault of blocks: poll or wait
  KVGeometry  a model's attention shape, and its layout in KV blocks
  KVCache   sequences' K and V with block tables, predictors, prefetch;
            step() appends a token and returns every layer's attention
  SynthSource  synthetic K/V and queries (lib/synth), all in C
  Attention decode attention over KV blocks in numpy memory
  PrefixCache  prompts' KV chunks kept by content in a cache directory
            (and in Redis below it), found again by the next process
  KvpagerError  what every failing call raises: errno, kvp_strerror text

Every failing call raises KvpagerError (an OSError) with the errno of the
C call and the library's explanation; wrong argument types raise
TypeError as usual.  Statistics are dicts.  Objects are context managers.

The library is loaded on first use of one of these names, so that the
package's pure-numpy modules (llama2_ref) import without it.
"""

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "KvpagerError": "_native", "strerror": "_native",
    "Pager": "pager", "Prefetch": "pager", "Region": "pager",
    "Store": "pager",
    "Attention": "kv", "KVCache": "kv", "KVGeometry": "kv",
    "KVSourceProtocol": "kv", "SynthSource": "kv", "simd_name": "kv",
    "PrefixCache": "prefix",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from ._native import KvpagerError, strerror  # noqa: F401
    from .kv import (Attention, KVCache, KVGeometry,  # noqa: F401
                     KVSourceProtocol, SynthSource, simd_name)
    from .pager import Pager, Prefetch, Region, Store  # noqa: F401
    from .prefix import PrefixCache  # noqa: F401


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvpager' has no attribute '{name}'")
    value = getattr(importlib.import_module("." + _EXPORTS[name], __name__),
                    name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
