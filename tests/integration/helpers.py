"""Building blocks of the end-to-end tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from changelake.connectors.kafka_broker import create_topics
from changelake.service.config import ChangelakeConfig, parse_config
from changelake.service.demo import demo_config
from changelake.service.inventory import InventoryDatabase, produce


def write_history(servers: str, *, seed: int, changes: int, topic_prefix: str,
                  sizes: dict[str, int] | None = None, redeliver: int = 50, partitions: int = 4) -> InventoryDatabase:
    """Produce an inventory history under fresh topic names (created with ``partitions`` partitions each,
    keyed messages spread over them); returns the simulated database."""
    import changelake.service.inventory as inv

    create_topics(servers, {inv.topic_for(t).replace(inv.SERVER, topic_prefix, 1): partitions for t in inv.TABLES})
    db = InventoryDatabase(seed=seed)
    msgs = db.history(snapshot_sizes=sizes or {"customers": 50, "products": 80, "orders": 120},
                      changes=changes, redeliver=redeliver)
    produce((inv.Message(m.topic.replace(inv.SERVER, topic_prefix, 1), m.key, m.value) for m in msgs), servers)
    return db


def pipeline_config(servers: str, workdir: Path, *, topic_prefix: str, max_records: int = 100_000,
                    overrides: dict[str, Any] | None = None, vacuum: bool = True) -> tuple[ChangelakeConfig, Path]:
    """The demo's mirrors on fresh topics; ``vacuum=False``: no scheduled VACUUM (due at each sink's first
    batch; with delta-spark ~60 Spark jobs per table)."""
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0,
                      pipeline_id=f"it-{topic_prefix}", max_records_per_batch=max_records, views=False)
    if not vacuum:
        for table in raw["tables"]:
            table["maintenance"] = {"vacuum_every": None}
    for source in raw["sources"]:
        source["topics"] = [t.replace("dbserver1", topic_prefix, 1) for t in source["topics"]]
    for section, values in (overrides or {}).items():
        if isinstance(values, dict):
            raw.setdefault(section, {}).update(values)
        else:
            raw[section] = values
    path = workdir / "pipeline.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path)), path
