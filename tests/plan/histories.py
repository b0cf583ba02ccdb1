"""Random change histories for the property tests: per-key Debezium-like messages, delivered at least once."""

from __future__ import annotations

import random
from collections.abc import Iterable

from changelake.changelog import RowKind

I, UB, UA, D = (int(k) for k in (RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE))


def key_histories(ops: Iterable[tuple], tag: str | None = None) -> tuple[dict, dict]:
    """``ops`` of ``(key, a, b, delete)`` -> per key its messages (each a list of ``(kind, row)``, or
    ``(tag, kind, row)`` with a tag) and the final row per key. A row is ``(key, a, b)``; the first op of a
    key inserts, a later one deletes or updates (``-U`` of the old row, ``+U`` of the new)."""
    state: dict = {}
    per_key: dict = {}
    for key, a, b, delete in ops:
        row = (key, a, b)
        pre = state.get(key)
        if pre is None:
            msg = [(I, row)]
            state[key] = row
        elif delete:
            msg = [(D, pre)]
            del state[key]
        else:
            msg = [(UB, pre), (UA, row)]
            state[key] = row
        per_key.setdefault(key, []).append(msg if tag is None else [(tag, k, r) for k, r in msg])
    return per_key, state


def deliver(per_key: dict, rnd: random.Random) -> list[list]:
    """Interleave the keys' messages keeping each key's order, with at-least-once rewinds:
    a key's stream may jump back and re-deliver from an earlier message onward."""
    streams = []
    for msgs in per_key.values():
        out, i = [], 0
        while i < len(msgs):
            out.append(msgs[i])
            i += 1
            if i > 1 and rnd.random() < 0.15:
                i = rnd.randrange(0, i)          # rewind: re-deliver from message i on
        streams.append(out)
    delivered = []
    while streams:
        s = rnd.choice(streams)
        delivered.append(s.pop(0))
        if not s:
            streams.remove(s)
    return delivered
