"""Operator figures made in Spark's Python workers reach the driver's /metrics through the report channel.

The kernels run in Python worker processes whose registries nobody scrapes. Here a sink upsert
materializer and a normalize run on Spark over one micro-batch that makes each count something (a
correction, a stale retraction); after the batch the driver drains the channel, and the figures
must be on the driver's /metrics, labelled as the dashboard reads them, with the state gauges per
node equal to what the same kernels hold in-process.
"""

from __future__ import annotations

import urllib.request

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from changelake.changelog import KIND, SEQ
from changelake.operators import Changes, Deduplicate, DeduplicateConfig
from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig
from changelake.service.http import Health, HttpEndpoint
from changelake.spark.binding import apply_kernel
from changelake.spark.reports import ReportChannel

from .conftest import run_to_end, write_micro_batch

pytestmark = pytest.mark.spark

KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}
# key 1: two rows alive for one sink key, then the later one retracted -> the materializer re-emits the
# earlier one (a correction); key 2: a delete of a row never seen -> a stale retraction in the normalize
ROWS = [("+I", 1, "a"), ("+I", 1, "b"), ("-D", 1, "b"), ("-D", 2, "x"), ("+I", 3, "c")]
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), (KIND, pa.int8()), (SEQ, pa.string())])


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_worker_figures_reach_the_driver_metrics(rocksdb, tmp_path):
    from pyspark.sql.types import StructType

    table = pa.table({"id": [r[1] for r in ROWS], "v": [r[2] for r in ROWS],
                      KIND: pa.array([KINDS[r[0]] for r in ROWS], pa.int8()),
                      SEQ: [f"{i:04d}" for i in range(len(ROWS))]}, schema=SCHEMA)
    (tmp_path / "in").mkdir()
    write_micro_batch(table, tmp_path / "in", 0)
    df = rocksdb.readStream.schema(StructType.fromDDL("id BIGINT, v STRING, _kind TINYINT, _seq STRING")) \
        .parquet(str(tmp_path / "in"))
    out_schema = StructType.fromDDL("id BIGINT, v STRING")
    materialize = SinkUpsertMaterializerConfig(keys=(0,), table="report_channel_t")
    normalize = DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False)
    channel = ReportChannel(rocksdb)
    a = apply_kernel(df, SinkUpsertMaterializer, materialize, key_columns=["id"], output_schema=out_schema,
                     buckets=2, channel=channel, node="materialize_t")
    b = apply_kernel(df, Deduplicate, normalize, key_columns=["id"], output_schema=out_schema, buckets=2,
                     channel=channel, node="normalize_t")

    endpoint = HttpEndpoint(Health(max_silence_s=60), host="127.0.0.1", port=0).start()
    try:
        before = _scrape(endpoint.url())
        drained = []
        run_to_end(a.unionByName(b), lambda batch, _: (batch.count(), drained.append(channel.drain())),
                   tmp_path / "ckpt")
        after = _scrape(endpoint.url())
    finally:
        endpoint.stop()

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    # what the same kernels count and hold in-process
    rows = Changes.of([(k, (i, v)) for k, i, v in ROWS])
    local_m, local_n = SinkUpsertMaterializer(materialize), Deduplicate(normalize)
    local_m.process(rows), local_n.process(rows)
    assert dict(local_m.take_figures()) == {("materializer_corrections", "report_channel_t"): 1,
                                            ("stale_retractions", "SinkUpsertMaterializer"): 1}
    assert dict(local_n.take_figures()) == {("stale_retractions", "Deduplicate"): 1}

    assert grew("changelake_materializer_corrections_total", table="report_channel_t") == 1
    assert grew("changelake_stale_retractions_total", operator="Deduplicate") == 1
    assert grew("changelake_stale_retractions_total", operator="SinkUpsertMaterializer") == 1
    assert after[("changelake_state_rows", (("operator", "materialize_t"),))] == local_m.state_rows
    assert after[("changelake_state_rows", (("operator", "normalize_t"),))] == local_n.state_rows
    assert after[("changelake_state_bytes", (("operator", "normalize_t"),))] > 0
    assert channel.drain().late == {}, "a drain empties the channel"
