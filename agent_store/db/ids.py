"""The ids the store makes itself: a run's, and a message's that came with none. 20 characters instead of a
UUID's 32 hex digits, and a run's in time order.

Every message row holds both (its own id and its run's), and a run's id is in the run log's and the usage
ledger's keys: 12 bytes fewer in each is about 40 bytes per message after a turn (issue 43). A run's id starts
with the time, so a session's runs go to the end of its part of those keys: inserts in the middle of a B-tree
page split it into two half-full pages. The alphabet (lowercase Crockford base32) sorts the same way under
every collation: digits before letters, one case, no punctuation.
"""

from __future__ import annotations

import base64
import os
import time

# base64.b32encode's alphabet (RFC 4648), mapped to one in ASCII order.
_SORTABLE = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", b"0123456789abcdefghjkmnpqrstvwxyz")
LENGTH = 20  # characters: 100 bits


def _encoded(value: int) -> str:
    """``value`` (100 bits) as 20 characters, most significant first (13 bytes encode to 21; the last is padding
    of the four zero bits added)."""
    return base64.b32encode((value << 4).to_bytes(13, "big"))[:LENGTH].translate(_SORTABLE).decode()


def run_id() -> str:
    """The Unix time in milliseconds (42 bits: until the year 2109), then 58 random bits. Two runs of one session
    share an id only if they start in the same millisecond and draw the same 58 bits."""
    return _encoded((time.time_ns() // 1_000_000) << 58 | int.from_bytes(os.urandom(8), "big") >> 6)


def random_id() -> str:
    """100 random bits (a message's own id, which is looked up by its hash: its order buys nothing)."""
    return _encoded(int.from_bytes(os.urandom(13), "big") >> 4)
