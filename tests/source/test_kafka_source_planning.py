"""Offset planning of the Kafka source: admission control, packing, options."""

from __future__ import annotations

import pytest

from changelake.spark.kafka_source import KafkaOptions, KafkaRange, _admit, pack_ranges
from changelake.errors import SourceError

pytestmark = pytest.mark.unit


def _marks(**parts: tuple[int, int]) -> dict[tuple[str, int], tuple[int, int]]:
    return {("t", int(p[1:])): v for p, v in parts.items()}


def test_admission_control_caps_the_batch_and_shares_it_fairly():
    start = {"t": {"0": 0, "1": 0, "2": 0}}
    end = {"t": {"0": 1000, "1": 10, "2": 1000}}
    cut = _admit(start, end, 300, _marks(p0=(0, 1000), p1=(0, 10), p2=(0, 1000)))
    sizes = {p: cut["t"][p] - start["t"][p] for p in cut["t"]}
    assert sum(sizes.values()) == 300
    assert sizes["1"] == 10                      # a small partition is drained
    assert abs(sizes["0"] - sizes["2"]) <= 1     # the rest is shared evenly


def test_admission_never_moves_backwards_and_skips_expired_ranges():
    start = {"t": {"0": 5}}
    cut = _admit(start, {"t": {"0": 100}}, 10, _marks(p0=(50, 100)))
    assert cut["t"]["0"] == 60    # budget counts from the low watermark, not from offsets that no longer exist


def test_admission_with_more_budget_than_data_reads_everything():
    start = {"t": {"0": 0, "1": 3}}
    end = {"t": {"0": 7, "1": 9}}
    assert _admit(start, end, 1_000, _marks(p0=(0, 7), p1=(0, 9))) == end


def test_ranges_are_packed_into_balanced_tasks_and_none_is_lost():
    ranges = [KafkaRange("a", p, 0, n) for p, n in enumerate([100, 90, 10, 10, 5, 1])]
    tasks = pack_ranges(ranges, 2)
    assert len(tasks) == 2
    packed = sorted((r.topic, r.partition, r.start, r.end) for t in tasks for r in t.ranges)
    assert packed == sorted((r.topic, r.partition, r.start, r.end) for r in ranges)
    loads = sorted(sum(r.end - r.start for r in t.ranges) for t in tasks)
    assert loads[1] - loads[0] <= 10     # balanced to within the size of one small range


def test_options_need_exactly_one_topic_selector():
    with pytest.raises(SourceError, match="exactly one of 'topics'"):
        KafkaOptions.parse({"bootstrap.servers": "x:1"})
    with pytest.raises(SourceError, match="exactly one of 'topics'"):
        KafkaOptions.parse({"bootstrap.servers": "x:1", "topics": "a", "topicPattern": "b.*"})
    with pytest.raises(SourceError, match="bootstrap.servers"):
        KafkaOptions.parse({"topics": "a"})
    with pytest.raises(SourceError, match="not a valid regular expression"):
        KafkaOptions.parse({"bootstrap.servers": "x:1", "topicPattern": "("})


def test_kafka_properties_pass_through_to_the_consumer():
    opts = KafkaOptions.parse({"bootstrap.servers": "x:1", "topics": "a,b",
                               "kafka.security.protocol": "SASL_SSL", "kafka.sasl.password": "s3cret"})
    conf = opts.consumer_config()
    assert opts.topics == ("a", "b")
    assert conf["security.protocol"] == "SASL_SSL" and conf["sasl.password"] == "s3cret"
    assert conf["enable.auto.commit"] is False


def test_a_range_consumer_fetches_in_small_steps_unless_the_user_set_the_fetch_size():
    """A range's consumer fetches 1 MB of its partition at a time, not 16 MB (it would otherwise decompress far
    more than the range); it does not bound its queue (that made many small ranges slow); a user's own kafka.*
    settings still win."""
    opts = KafkaOptions.parse({"bootstrap.servers": "x:1", "topics": "a"})
    conf = opts.consumer_config(records=15_625)
    assert conf["max.partition.fetch.bytes"] == 1024 * 1024 and "queued.min.messages" not in conf
    assert opts.consumer_config()["max.partition.fetch.bytes"] == 16 * 1024 * 1024     # the driver's client
    mine = KafkaOptions.parse({"bootstrap.servers": "x:1", "topics": "a", "kafka.queued.min.messages": "500000",
                               "kafka.max.partition.fetch.bytes": "8388608"}).consumer_config(records=10)
    assert mine["queued.min.messages"] == "500000" and mine["max.partition.fetch.bytes"] == "8388608"


def test_option_names_are_case_insensitive_as_spark_passes_them_lower_cased():
    opts = KafkaOptions.parse({"bootstrap.servers": "x:1", "topicpattern": "a.*", "maxrecordspertrigger": "150",
                               "startingoffsets": "latest", "readtasks": "3"})
    assert (opts.topic_pattern, opts.max_records_per_trigger, opts.starting_offsets, opts.read_tasks) == \
        ("a.*", 150, "latest", 3)


class _TimesClient:
    """Answers offsets-for-times as a broker does: per partition, an offset (-1: no record at or after the time)."""

    def __init__(self, answers: dict[tuple[str, int], int], error: str | None = None) -> None:
        self.answers, self.error, self.asked = answers, error, []

    def offsets_for_times(self, partitions, timeout):
        from confluent_kafka import KafkaError, TopicPartition

        self.asked = [(tp.topic, tp.partition, tp.offset) for tp in partitions]
        if not self.error:
            return [TopicPartition(tp.topic, tp.partition, self.answers[(tp.topic, tp.partition)]) for tp in partitions]
        # confluent-kafka's TopicPartition.error cannot be set from Python: an object of the same shape
        from types import SimpleNamespace
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1,
                                error=KafkaError(KafkaError._UNKNOWN_PARTITION, self.error)) for tp in partitions]


def _reader_with(client, marks, starting):
    from changelake.spark.kafka_source import KafkaStreamReader

    reader = KafkaStreamReader(KafkaOptions.parse({"bootstrap.servers": "localhost:1", "topics": "t,u",
                                                   "startingOffsets": starting}))
    reader._admin_consumer = client
    reader._partitions = lambda: sorted(marks)
    reader._watermarks = lambda parts: marks
    return reader


def test_starting_offsets_by_timestamp_take_the_brokers_answer_per_partition():
    marks = {("t", 0): (0, 100), ("t", 1): (50, 80), ("t", 2): (0, 30), ("u", 0): (0, 9)}
    client = _TimesClient({("t", 0): 42, ("t", 1): 10, ("t", 2): -1})
    reader = _reader_with(client, marks, '{"t": {"timestamp": 1793491200000}}')
    # found; below the low watermark (expired since): the low watermark; none at or after: the end
    assert reader.initialOffset() == {"t": {"0": 42, "1": 50, "2": 30}, "u": {"0": 0}}
    assert client.asked == [("t", p, 1793491200000) for p in (0, 1, 2)]


def test_starting_offsets_by_timestamp_report_what_went_wrong():
    marks = {("t", 0): (0, 100)}
    with pytest.raises(SourceError, match=r"offset of t\[0\] at timestamp 1793491200000"):
        _reader_with(_TimesClient({("t", 0): -1}, error="no leader"), marks,
                     '{"t": {"timestamp": 1793491200000}}').initialOffset()
    with pytest.raises(SourceError, match="epoch milliseconds"):
        _reader_with(_TimesClient({}), marks, '{"t": {"timestamp": "2026-11-01"}}').initialOffset()


def test_a_source_starting_at_a_time_asks_for_it_in_epoch_ms():
    import json

    import yaml

    from changelake.errors import ConfigError
    from changelake.service.config import parse_config
    from changelake.service.query_start import kafka_reader_options

    def config(source: dict):
        raw = {"pipeline": {"id": "p", "checkpoint": "/tmp/c"}, "kafka": {"bootstrap_servers": "localhost:1"},
               "sources": [{"name": "s", "table": "s", **source}], "tables": [{"name": "s", "primary_key": ["id"]}]}
        return parse_config(yaml.safe_dump(raw, sort_keys=False).replace("'2026-11-01T00:00:00Z'",
                                                                         "2026-11-01T00:00:00Z"))

    opts = kafka_reader_options(config({"topics": ["a", "b"], "starting_offsets": {"timestamp": "2026-11-01T00:00:00Z"}}))
    assert json.loads(opts["startingOffsets"]) == {"a": {"timestamp": 1793491200000}, "b": {"timestamp": 1793491200000}}
    with pytest.raises(ConfigError, match="needs 'topics'"):
        config({"topic_pattern": "a.*", "starting_offsets": {"timestamp": "2026-11-01T00:00:00Z"}})


class _Msg:
    def __init__(self, headers, value=b"v"):
        self._headers, self._value = headers, value

    def headers(self):
        return self._headers

    def timestamp(self):
        return (1, 1_700_000_000_000)

    def key(self):
        return b"k"

    def value(self):
        return self._value


def test_replayed_records_take_their_original_position_and_other_pipelines_replays_are_left_out():
    from changelake.spark.kafka_source import KafkaRange, _record_batch

    def h(pipeline, offset):
        return [("changelake.topic", b"db.t"), ("changelake.partition", b"2"),
                ("changelake.offset", str(offset).encode()), ("changelake.pipeline", pipeline.encode())]

    msgs = [_Msg(h("p1", 17)), _Msg(h("other", 18)), _Msg(None, b"by hand"), _Msg(h("p1", 5))]
    batch = _record_batch(KafkaRange("db.t.replay", 0, 0, 4), msgs, [0, 1, 2, 3], 0, replayed="p1")
    assert [(r["topic"], r["partition"], r["offset"], r["value"]) for r in batch.to_pylist()] == [
        ("db.t", 2, 17, b"v"), ("db.t.replay", 0, 2, b"by hand"), ("db.t", 2, 5, b"v")]


def _ramp_reader(marks, **options):
    from changelake.spark.kafka_source import KafkaStreamReader

    reader = KafkaStreamReader(KafkaOptions.parse({"bootstrap.servers": "localhost:1", "topics": "t", **options}))
    reader._partitions = lambda: sorted(marks)
    reader._watermarks = lambda parts: marks
    return reader


def _batches(reader, start, limit, until):
    """The sizes of the batches ``reader`` plans from ``start`` until it reaches ``until`` records in all."""
    sizes, read = [], 0
    while read < until:
        end = reader.latestOffset(start, limit)
        n = sum(end["t"][p] - start["t"][p] for p in end["t"])
        if not n:
            break
        sizes.append(n)
        read, start = read + n, end
    return sizes


def test_after_a_start_the_first_batches_ramp_up_to_the_cap_and_a_backlog_is_read_whole():
    from pyspark.sql.streaming.datasource import ReadMaxRows

    marks = {("t", 0): (0, 60_000), ("t", 1): (0, 60_000)}
    reader = _ramp_reader(marks, maxRecordsPerTrigger="20000", firstRecordsPerTrigger="1250")
    start = {"t": {"0": 0, "1": 0}}
    # a restart's first batch commits early; each next one doubles until the cap; nothing is skipped
    assert _batches(reader, start, ReadMaxRows(20_000), 120_000) == \
        [1250, 2500, 5000, 10_000, *[20_000] * 5, 1250]
    # a new reader (the next start of the pipeline) ramps again
    again = _ramp_reader(marks, maxRecordsPerTrigger="20000", firstRecordsPerTrigger="1250")
    assert _batches(again, {"t": {"0": 50_000, "1": 50_000}}, ReadMaxRows(20_000), 20_000)[:2] == [1250, 2500]


def test_an_idle_trigger_does_not_use_up_the_ramp_and_without_a_first_size_every_batch_is_full():
    from pyspark.sql.streaming.datasource import ReadMaxRows

    marks = {("t", 0): (0, 100)}
    reader = _ramp_reader(marks, maxRecordsPerTrigger="1000", firstRecordsPerTrigger="10")
    start = {"t": {"0": 100}}
    for _ in range(5):                      # nothing new: no batch planned, the ramp waits
        assert reader.latestOffset(start, ReadMaxRows(1000)) == start
    marks[("t", 0)] = (0, 5_000)
    assert _batches(reader, start, ReadMaxRows(1000), 70) == [10, 20, 40]
    plain = _ramp_reader({("t", 0): (0, 5_000)}, maxRecordsPerTrigger="1000")
    assert _batches(plain, {"t": {"0": 0}}, ReadMaxRows(1000), 3_000) == [1000, 1000, 1000]


def test_a_catch_up_with_available_now_reads_full_batches_from_the_start():
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    marks = {("t", 0): (0, 3_000)}
    reader = _ramp_reader(marks, maxRecordsPerTrigger="1000", firstRecordsPerTrigger="10")
    reader.prepareForTriggerAvailableNow()
    assert _batches(reader, {"t": {"0": 0}}, ReadAllAvailable(), 3_000) == [1000, 1000, 1000]


def test_the_first_batch_size_must_be_positive():
    with pytest.raises(SourceError, match="firstRecordsPerTrigger must be a positive number"):
        KafkaOptions.parse({"bootstrap.servers": "x:1", "topics": "a", "firstRecordsPerTrigger": "0"})


def test_the_pipeline_ramps_from_a_sixteenth_of_its_batch_cap_and_at_least_10000_records_unless_told_otherwise():
    import yaml

    from changelake.service.config import parse_config
    from changelake.service.query_start import kafka_reader_options

    def options(**pipeline):
        raw = {"pipeline": {"id": "p", "checkpoint": "/tmp/c", **pipeline}, "kafka": {"bootstrap_servers": "k:1"},
               "sources": [{"name": "s", "table": "s", "topics": ["a"]}], "tables": [{"name": "s", "primary_key": ["id"]}]}
        opts = kafka_reader_options(parse_config(yaml.safe_dump(raw)))
        parsed = KafkaOptions.parse(opts)
        return parsed.max_records_per_trigger, parsed.first_records_per_trigger

    assert options() == (200_000, 12_500)
    assert options(max_records_per_batch=80_000) == (80_000, 10_000)    # a batch below that is its fixed cost
    assert options(max_records_per_batch=10_000) == (10_000, None)      # small batches: no ramp
    assert options(max_records_per_batch=20_000, first_batch_records=500) == (20_000, 500)
    assert options(max_records_per_batch=20_000, first_batch_records=20_000) == (20_000, None)   # no ramp
    assert options(max_records_per_batch=20_000, first_batch_records=90_000) == (20_000, None)
    assert options(max_records_per_batch=None) == (None, None)
