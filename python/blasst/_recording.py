"""The statistics recorders of the framework integrations (blasst.transformers, blasst.diffusers):
each keeps a list of the recorders active now, under a lock; ``active`` adds one for the duration
of a with block."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, List


@contextlib.contextmanager
def active(recorders: List[Any], lock: threading.Lock, rec: Any) -> Iterator[Any]:
    """Register rec in recorders while the block runs; yield it."""
    with lock:
        recorders.append(rec)
    try:
        yield rec
    finally:
        with lock:
            recorders.remove(rec)
