"""Random ids (requests, completions, sessions, quota leases) from one read of the OS's random
source per few hundred ids.

`os.urandom` is a system call that releases the GIL: at four a request it gave the store's thread
four chances a request to take the interpreter from the event loop mid-request. These are the same
bytes the OS gives, each handed out once; a forked child starts with an empty pool, so no two
processes ever hand out the same id. Not thread-safe: each owner uses it from the event loop only.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Mapping

_POOL_BYTES = 4096  # 256 ids of 16 bytes a read


class RandomIds:
    def __init__(self, pool_bytes: int = _POOL_BYTES) -> None:
        self._pool_bytes = pool_bytes
        self._pool = b""
        self._at = 0
        owner = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget(owner))

    def hex(self, nbytes: int = 16) -> str:
        """`nbytes` random bytes as 2 * `nbytes` lowercase hex digits."""
        start, end = self._at, self._at + nbytes
        if end > len(self._pool):
            self._pool, start, end = os.urandom(max(self._pool_bytes, nbytes)), 0, nbytes
        self._at = end
        return self._pool[start:end].hex()

    def forget(self) -> None:
        """Drop the unused bytes (a forked child must not hand out its parent's)."""
        self._pool, self._at = b"", 0


def _forget(owner: weakref.ref[RandomIds]) -> None:
    ids = owner()
    if ids is not None:
        ids.forget()


# A client's X-Request-Id is kept only if it is short and plain; anything else is replaced by an
# id of our own (not refused: the id is a convenience, and refusing would break the request).
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id_from(headers: Mapping[str, str], ids: RandomIds) -> str:
    """The client's X-Request-Id (headers by lower-case name) if it is plain, else a new id."""
    given = headers.get("x-request-id")
    return given if given is not None and _REQUEST_ID.match(given) else ids.hex()
