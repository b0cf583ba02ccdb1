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


def test_option_names_are_case_insensitive_as_spark_passes_them_lower_cased():
    opts = KafkaOptions.parse({"bootstrap.servers": "x:1", "topicpattern": "a.*", "maxrecordspertrigger": "150",
                               "startingoffsets": "latest", "readtasks": "3"})
    assert (opts.topic_pattern, opts.max_records_per_trigger, opts.starting_offsets, opts.read_tasks) == \
        ("a.*", 150, "latest", 3)
