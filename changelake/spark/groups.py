"""Group numbers of the chain's operators: which shuffle partition each state bucket's task runs in.

Every operator of the chain groups its envelopes by ``g`` (:mod:`changelake.spark.chain`), and Spark
sends group ``g`` to shuffle partition ``pmod(murmur3_32(g, seed 42), P)``: the ``HashPartitioning`` of
one int column, ``P`` the query's ``spark.sql.shuffle.partitions`` (fixed by its checkpoint). With
``g`` = the bucket, the hash decides how buckets share the partitions: 32 buckets on 2 partitions split
12 / 20, so one task of every stateful operator had 62% of its work, and every pass-through envelope
(groups -1 and -2) landed in that same task.

:class:`GroupLayout` numbers the groups so that they spread evenly: bucket ``b`` of every node gets
the ``b // P``-th non-negative int that hashes to partition ``b mod P``, and pass-through envelopes
the negative group of partition ``bucket mod P``. The numbering is part of the checkpoint contract (a
bucket's state lives under its group number), so a checkpoint remembers its layout in
``<checkpoint>/changelake/groups.json``; a checkpoint written before it existed (an offset log and
no such file) keeps the old numbering, ``g`` = the bucket (:meth:`GroupLayout.legacy`).

The same record says how the chain's nodes share its operators (``stages``): ``"level"``, one
operator per level of the graph, all stateful nodes of a level in it, each with its own range of the
operator's buckets (:class:`changelake.spark.chain.Chain`); a checkpoint recorded without it ran one
operator per stateful node and keeps that, since Spark keeps an operator's state by its place in the
query.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

#: Spark's seed for ``hash()`` and ``HashPartitioning``.
SPARK_HASH_SEED = 42
#: Pass-through groups of the old numbering (``-1 - bucket mod LEGACY_PASS_GROUPS``).
LEGACY_PASS_GROUPS = 2
_MASK = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``Murmur3_x86_32.hashInt``: the signed 32-bit ``hash()`` of an int column's value."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = _rotl(seed ^ k1, 13) * 5 + 0xE6546B64 & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


def spark_partition(value: int, partitions: int) -> int:
    """The shuffle partition of an int group key among ``partitions`` (Spark's ``pmod(hash, P)``)."""
    return spark_hash_int(value) % partitions


class GroupLayout:
    """Bucket -> group number of a node's state, and the pass-through groups (module docstring).

    ``partitions`` None: the old numbering (``g`` = bucket; pass-through ``-1 - bucket mod 2``).
    ``per_level``: the chain runs one operator per level of the graph, not one per stateful node
    (default: for a balanced layout; the old numbering predates it)."""

    def __init__(self, partitions: int | None, max_buckets: int = 0, per_level: bool | None = None) -> None:
        if partitions is not None and partitions < 1:
            raise ValueError(f"shuffle partitions must be >= 1, got {partitions}")
        if per_level and partitions is None:
            raise ValueError("the old numbering runs one operator per stateful node")
        self.partitions = partitions
        self.per_level = partitions is not None if per_level is None else per_level
        self._size = 0
        self._state = np.zeros(0, np.int32)
        self._pass = np.array([-1 - i for i in range(LEGACY_PASS_GROUPS)], np.int32)
        self._bucket: dict[int, int] = {}
        if partitions is not None:
            self._pass = np.array(_pass_groups(partitions), np.int32)
        self._grow(max_buckets)

    @classmethod
    def legacy(cls) -> GroupLayout:
        return cls(None)

    @property
    def balanced(self) -> bool:
        return self.partitions is not None

    def _grow(self, buckets: int) -> None:
        if buckets <= self._size:
            return
        if self.partitions is None:
            self._state = np.arange(buckets, dtype=np.int32)
        else:
            self._state = np.array(_state_groups(self.partitions, buckets), np.int32)
        self._bucket = {int(g): b for b, g in enumerate(self._state)}
        self._size = buckets

    def state_group(self, bucket: int) -> int:
        """The group number of ``bucket`` of any node's state."""
        self._grow(bucket + 1)
        return int(self._state[bucket])

    def bucket(self, group: int) -> int:
        """The bucket whose state lives under ``group`` (>= 0)."""
        found = self._bucket.get(group)
        while found is None and group >= 0 and (self._size == 0 or group > int(self._state.max())):
            self._grow(max(2 * self._size, 1))              # a bucket beyond the tables built so far
            found = self._bucket.get(group)
        if found is None:
            raise KeyError(f"group {group} is no state bucket's of this layout")
        return found

    def next_group(self, target: np.ndarray, bucket: np.ndarray, position: int) -> np.ndarray:
        """``g`` of each envelope for chain operator ``position``: its bucket's group for the envelopes
        addressed to it, a pass-through group for every other (``target``: the operator each envelope is
        addressed to, negative for none; ``bucket``: its bucket among that operator's)."""
        bucket = np.asarray(bucket, dtype=np.int64)
        g = self._pass[bucket % len(self._pass)]
        mine = np.asarray(target) == position
        if mine.any():
            own = bucket[mine]
            self._grow(int(own.max()) + 1)
            g[mine] = self._state[own]
        return g.astype(np.int32)

    def to_json(self) -> dict:
        out = {"layout": "balanced" if self.balanced else "legacy", "partitions": self.partitions}
        if self.per_level:
            out["stages"] = "level"
        return out

    def with_buckets(self, max_buckets: int) -> GroupLayout:
        """The same layout with its tables built for ``max_buckets`` buckets per operator."""
        return GroupLayout(self.partitions, max_buckets, self.per_level)

    def __repr__(self) -> str:
        return f"GroupLayout(partitions={self.partitions}, per_level={self.per_level})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, GroupLayout) and other.partitions == self.partitions
                and other.per_level == self.per_level)

    def __hash__(self) -> int:
        return hash((self.partitions, self.per_level))

    def __getstate__(self) -> dict:          # workers rebuild the tables: a few ms, and nothing big pickled
        return {"partitions": self.partitions, "max_buckets": self._size, "per_level": self.per_level}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["partitions"], state["max_buckets"], state.get("per_level", False))


@lru_cache(maxsize=16)
def _state_groups(partitions: int, buckets: int) -> tuple[int, ...]:
    by_partition: list[list[int]] = [[] for _ in range(partitions)]
    need = [len(range(p, buckets, partitions)) for p in range(partitions)]
    value = 0
    while any(len(found) < n for found, n in zip(by_partition, need)):
        p = spark_partition(value, partitions)
        if len(by_partition[p]) < need[p]:
            by_partition[p].append(value)
        value += 1
    return tuple(by_partition[b % partitions][b // partitions] for b in range(buckets))


@lru_cache(maxsize=16)
def _pass_groups(partitions: int) -> tuple[int, ...]:
    found: dict[int, int] = {}
    value = -1
    while len(found) < partitions:
        found.setdefault(spark_partition(value, partitions), value)
        value -= 1
    return tuple(found[p] for p in range(partitions))


MARKER = "changelake/groups.json"


def checkpoint_layout(checkpoint: str, partitions: int) -> GroupLayout:
    """The layout of the query whose checkpoint is ``checkpoint``: the one it recorded; the old numbering
    for a checkpoint that has an offset log but no record (written before layouts existed); else a new
    balanced layout over ``partitions`` (the session's shuffle partitions, which Spark records in the
    checkpoint with the first batch), recorded before the query starts."""
    from changelake.spark.checkpoint import filesystem

    fs, root = filesystem(checkpoint)
    from pyarrow import fs as pafs

    path = f"{root}/{MARKER}"
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as f:
            recorded = json.loads(f.read().decode())
        if recorded.get("layout") == "legacy":
            return GroupLayout.legacy()
        if (recorded.get("layout") != "balanced" or not isinstance(recorded.get("partitions"), int)
                or recorded.get("stages", "node") not in ("node", "level")):
            raise ValueError(f"{checkpoint}: {MARKER} holds no layout this version knows: {recorded!r}; "
                             "was the checkpoint written by a newer changelake?")
        return GroupLayout(recorded["partitions"], per_level=recorded.get("stages") == "level")
    offsets = fs.get_file_info(pafs.FileSelector(f"{root}/offsets", allow_not_found=True))
    layout = GroupLayout.legacy() if any(i.base_name.isdigit() for i in offsets) else GroupLayout(partitions)
    fs.create_dir(f"{root}/changelake", recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(layout.to_json()).encode())
    return layout
