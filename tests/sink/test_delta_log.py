"""``TxnVersions``: a table's transaction version of one app id, followed commit by commit after delta-rs's
first answer (changelake.connectors.delta_log); what it follows must be what delta-rs would answer."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from changelake.connectors.delta_log import FOLLOW_AT_MOST, LOOK_BACK, TxnVersions

pytestmark = pytest.mark.unit

APP = "changelake:p:orders"


def _commit(path, txn: int | None = None, app: str = APP) -> None:
    props = CommitProperties(app_transactions=[Transaction(app_id=app, version=txn)]) if txn is not None else None
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}), mode="append", commit_properties=props)


def _answers(path, txns: TxnVersions) -> tuple[int | None, int | None]:
    """(what ``txns`` says, what delta-rs replays from the log) at the table's latest version."""
    table = DeltaTable(path)
    return txns.of(path, table), table.transaction_version(APP)


def test_the_followed_version_is_delta_rs_s_through_every_kind_of_commit(tmp_path):
    path = str(tmp_path / "t")
    _commit(path, 1)
    txns = TxnVersions(APP)
    assert _answers(path, txns) == (1, 1)
    _commit(path)                       # a commit without a transaction (maintenance, another job)
    assert _answers(path, txns) == (1, 1)
    _commit(path, 9, app="changelake:other:orders")     # another pipeline's
    assert _answers(path, txns) == (1, 1)
    _commit(path, 2)
    _commit(path, 5)                    # two at once: a second instance of the pipeline, say
    assert _answers(path, txns) == (5, 5)


def test_what_it_cannot_follow_is_asked_of_delta_rs(tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    _commit(path, 1)
    txns = TxnVersions(APP)
    txns.seed(path, 0, 0)
    for n in range(FOLLOW_AT_MOST + 1):     # too far ahead to read commit by commit
        _commit(path, 2 + n)
    assert _answers(path, txns) == (FOLLOW_AT_MOST + 2,) * 2

    txns.seed(path, 10_000, 3)          # a handle newer than the table: the table was replaced
    assert _answers(path, txns) == (FOLLOW_AT_MOST + 2,) * 2

    version = DeltaTable(path).version()
    _commit(path, 100)
    table = DeltaTable(path)
    os.remove(tmp_path / "t" / "_delta_log" / f"{version + 1:020d}.json")     # cleaned up before it was read
    txns.seed(path, version, 7)
    monkeypatch.setattr(DeltaTable, "transaction_version", lambda self, app: 100)
    assert txns.of(path, table) == 100


def test_a_table_not_known_yet_is_read_from_its_newest_commits(tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    _commit(path, 1)
    _commit(path, 2, app="changelake:other:orders")
    for _ in range(LOOK_BACK - 2):
        _commit(path)
    table = DeltaTable(path)
    replays = []
    monkeypatch.setattr(DeltaTable, "transaction_version", lambda self, app: replays.append(app) or 1)
    assert TxnVersions(APP).of(path, table) == 1
    assert replays == []                # found within the newest LOOK_BACK commits: no replay
    _commit(path)                       # now one commit too far back
    assert TxnVersions(APP).of(path, DeltaTable(path)) == 1
    assert replays == [APP]
