"""A database failover end to end: the new primary's log positions start lower than the old one's.

Three sources on the embedded broker, through ``changelake run --available-now`` (Spark, micro-batches of
a few records, two runs so that an epoch carries over the checkpoint):

* MySQL, Debezium JSON with its schema (columns learnt from the envelope, decoded on the driver): the old
  primary (``server_id`` 1) reached ``mysql-bin.000003``; the new one (``server_id`` 2) starts again at
  ``mysql-bin.000001``;
* MySQL, Debezium JSON without schema (declared columns, decoded in the read tasks): GTIDs of a new server
  UUID, then ``RESET MASTER`` on that server (same UUID, positions back, time on);
* PostgreSQL, Debezium JSON: a restore, the LSNs (and Debezium's commit LSN in ``sequence``) go back.

Every change applies: each table equals the database's state after the last change (the truth, applied in
the order the changes were made), and the epoch changes are counted per source.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta

from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

_SCHEMA = {"type": "struct", "name": "envelope", "fields": [
    {"field": "before", "type": "struct", "optional": True,
     "fields": [{"field": "id", "type": "int64"}, {"field": "v", "type": "string", "optional": True}]},
    {"field": "after", "type": "struct", "optional": True,
     "fields": [{"field": "id", "type": "int64"}, {"field": "v", "type": "string", "optional": True}]},
    {"field": "op", "type": "string"}, {"field": "source", "type": "struct", "fields": []}]}


class History:
    """Changes made to one database, in order, with where each lands in Kafka and the truth they leave."""

    def __init__(self, topic: str, *, with_schema: bool) -> None:
        self.topic, self.with_schema = topic, with_schema
        self.truth: dict[int, str] = {}
        self.messages: list[tuple[int, bytes, bytes]] = []
        self.ts = 1_700_000_000_000

    def change(self, id_: int, value: str | None, source: dict) -> None:
        self.ts += 1000
        before = {"id": id_, "v": self.truth[id_]} if id_ in self.truth else None
        op = "d" if value is None else "u" if before else "c"
        after = None if value is None else {"id": id_, "v": value}
        payload = {"op": op, "before": before, "after": after, "ts_ms": self.ts,
                   "source": {"db": "shop", "table": "items", "ts_ms": self.ts, **source}}
        body = {"schema": _SCHEMA, "payload": payload} if self.with_schema else payload
        if value is None:
            self.truth.pop(id_)
        else:
            self.truth[id_] = value
        self.messages.append((id_ % 4, orjson.dumps({"id": id_}), orjson.dumps(body)))

    def produce(self, servers: str) -> None:
        producer = Producer({"bootstrap.servers": servers, "log_level": 3})
        for partition, key, value in self.messages:
            producer.produce(self.topic, key=key, value=value, partition=partition)
        producer.flush(30)
        self.messages = []


def mysql(server_id: int, file: int, pos: int, gtid: str | None = None) -> dict:
    return {"connector": "mysql", "server_id": server_id, "gtid": gtid, "file": f"mysql-bin.{file:06d}",
            "pos": pos, "row": 0}


def postgres(lsn: int, commit_lsn: int) -> dict:
    return {"connector": "postgresql", "lsn": lsn, "sequence": f'["{commit_lsn}","{lsn}"]', "txId": lsn // 10}


def _old_primary(h_schema: History, h_gtid: History, h_pg: History) -> None:
    for i in range(24):
        h_schema.change(i, f"a{i}", mysql(1, 1 + i // 10, 1000 + 100 * i))
        h_gtid.change(i, f"a{i}", mysql(0, 7, 1000 + 100 * i, gtid=f"3e11fa47-0000-0000-0000-00000000000a:{i + 1}"))
        h_pg.change(i, f"a{i}", postgres(50_000 + 100 * i, 50_000 + 100 * i))


def _after_failover(h_schema: History, h_gtid: History, h_pg: History) -> None:
    # new primary: mysql-bin.000001 again, lower positions; updates, deletes and inserts of old and new keys
    for n, i in enumerate([0, 5, 9, 13, 30, 31, 2, 0]):
        value = None if n == 6 else f"b{i}.{n}"
        h_schema.change(i, value, mysql(2, 1, 200 + 10 * n))
    # another server (a new GTID UUID, no server_id), then RESET MASTER on it (the same UUID, positions back)
    uuid = "9f0c2e11-0000-0000-0000-00000000000b"
    for n, i in enumerate([1, 6, 11, 40]):
        h_gtid.change(i, f"b{i}.{n}", mysql(0, 3, 5000 + 10 * n, gtid=f"{uuid}:{n + 1}"))
    for n, i in enumerate([1, 6, 12, 41]):
        h_gtid.change(i, None if n == 2 else f"c{i}.{n}", mysql(0, 1, 150 + 10 * n, gtid=f"{uuid}:{n + 1}"))
    # PostgreSQL restored to an earlier point: LSNs and commit LSNs lower than those already streamed
    for n, i in enumerate([3, 7, 8, 50, 3]):
        h_pg.change(i, None if n == 2 else f"b{i}.{n}", postgres(51_000 + 10 * n, 51_000 + 10 * n))


def _rows(path: str) -> dict[int, str]:
    return {r["id"]: r["v"] for r in read_delta(path, columns=["id", "v"]).to_pylist()}


def test_every_change_of_a_failover_history_applies(kafka, tmp_path):
    topics = {name: kafka.topic(f"failover-{name}") for name in ("schema", "gtid", "pg")}
    histories = {"schema": History(topics["schema"], with_schema=True),
                 "gtid": History(topics["gtid"], with_schema=False),
                 "pg": History(topics["pg"], with_schema=False)}
    columns = {"id": "bigint", "v": "string"}
    config = {
        "pipeline": {"id": f"it-{topics['schema']}", "checkpoint": str(tmp_path / "ckpt"), "max_records_per_batch": 7,
                     "spark_conf": {"spark.sql.shuffle.partitions": "2"}},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "storage": {"root": str(tmp_path / "lake")},
        "metrics": {"port": 0},
        "sources": [{"name": "mysql_schema", "topics": [topics["schema"]], "table": "mysql_schema"},
                    {"name": "mysql_gtid", "topics": [topics["gtid"]], "columns": columns, "table": "mysql_gtid"},
                    {"name": "postgres", "topics": [topics["pg"]], "columns": columns, "table": "postgres"}],
        "tables": [{"name": n, "primary_key": ["id"]} for n in ("mysql_schema", "mysql_gtid", "postgres")],
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config))

    _old_primary(*histories.values())
    for h in histories.values():
        h.produce(kafka.bootstrap_servers)
    first = _run_pipeline(path)
    assert first.returncode == 0, first.stderr[-3000:]

    _after_failover(*histories.values())
    for h in histories.values():
        h.produce(kafka.bootstrap_servers)
    second = _run_pipeline(path)
    assert second.returncode == 0, second.stderr[-3000:]

    lake = tmp_path / "lake"
    assert _rows(str(lake / "mysql_schema")) == histories["schema"].truth
    assert _rows(str(lake / "mysql_gtid")) == histories["gtid"].truth
    assert _rows(str(lake / "postgres")) == histories["pg"].truth
    logged = second.stderr
    assert "mysql_schema: new epoch" in logged and "server_id 1 to server_id 2" in logged
    assert "mysql_gtid: new epoch" in logged and "position went back" in logged
    assert "postgres: new epoch" in logged

    # docs/operations.md, "Database failover": its commands find the epochs kept in the checkpoint
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = doc.split("## Database failover", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).splitlines()
    assert block[0].startswith("changelake run --available-now -c pipeline.yaml")
    shown = subprocess.run(["bash", "-c", "\n".join(block[1:])], capture_output=True, text=True, check=True,
                           env={"CHECKPOINT": str(tmp_path / "ckpt"), "PATH": "/usr/bin:/bin"})
    newest, states = shown.stdout.split("\n", 1)
    assert newest.endswith(".json")
    epochs = json.loads(states)
    for name in ("schema", "gtid", "pg"):
        ordinals = [state["ordinal"] for state in epochs[topics[name]].values()]
        assert max(ordinals) >= 1, (name, epochs[topics[name]])
