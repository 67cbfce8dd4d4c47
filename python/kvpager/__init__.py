"""kvpager from Python: KV caches in virtual memory paged from NVMe.

A binding of libkvpager (ctypes; see _native.py for why).  The objects:

  Pager     the paging engine: a RAM budget, tunables as keyword arguments
  Region    virtual memory served from a store, viewed as numpy arrays
  Store     where blocks live when not resident (file, memory, faulty)
  Prefetch  an asynchronous prefault of blocks: poll or wait
  KvpagerError  what every failing call raises: errno, kvp_strerror text

Every failing call raises KvpagerError (an OSError) with the errno of the
C call and the library's explanation; wrong argument types raise
TypeError as usual.  Statistics are dicts.  Objects are context managers.
"""

from ._native import KvpagerError, strerror
from .pager import Pager, Prefetch, Region, Store

__all__ = ["KvpagerError", "Pager", "Prefetch", "Region", "Store",
           "strerror"]
