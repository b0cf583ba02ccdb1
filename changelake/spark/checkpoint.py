"""Reading a Spark streaming checkpoint from outside the query: its offset and commit logs.

``<checkpoint>/offsets/<batch id>``: a version line, the batch's metadata (JSON), then one line per
source with the offsets the batch ends at (the Kafka source's ``{topic: {partition: offset}}``).
``<checkpoint>/commits/<batch id>`` exists once the batch is done. Both are written by Spark; this
module only reads them (local paths, or object-store URIs pyarrow knows: s3a:// is read as s3://).

It also chooses how Spark writes a checkpoint on the local filesystem (:func:`use_local_file_manager`).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

Offsets = dict[str, dict[str, int]]

#: The Spark setting naming the class that writes a query's checkpoint files (offset and commit logs,
#: the state stores' files on the executors).
FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
#: Spark's manager over Hadoop's ``FileSystem`` API: for a local path, a temporary file renamed into place
#: with rename(2), which replaces the target atomically.
LOCAL_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def batch_end_offsets(checkpoint: str, batch_id: int) -> Offsets:
    """The end offsets of batch ``batch_id`` from the offset log ({} when it cannot be read)."""
    fs, root = filesystem(checkpoint)
    try:
        with fs.open_input_stream(f"{root}/offsets/{batch_id}") as f:
            lines = f.read().decode().splitlines()
    except (OSError, FileNotFoundError):
        return {}
    offsets: Offsets = {}
    for line in lines[2:]:
        try:
            value = json.loads(line) if line.strip() and line.strip() != "-" else None
            if isinstance(value, str):
                value = json.loads(value)
        except ValueError:
            continue
        if isinstance(value, dict):
            for topic, ps in value.items():
                if isinstance(ps, dict):
                    offsets.setdefault(topic, {}).update({str(p): int(o) for p, o in ps.items()})
    return offsets


def last_committed_batch(checkpoint: str) -> tuple[int, datetime] | None:
    """(id, commit time) of the newest batch in the commit log, or None before the first."""
    from pyarrow import fs as pafs

    fs, root = filesystem(checkpoint)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/commits", allow_not_found=True))
    except OSError:
        return None
    ids = sorted((int(i.base_name), i) for i in infos if i.base_name.isdigit())
    if not ids:
        return None
    batch_id, info = ids[-1]
    finished = info.mtime if info.mtime is not None else datetime.fromtimestamp(0, timezone.utc)
    if finished.tzinfo is None:
        finished = finished.replace(tzinfo=timezone.utc)
    return batch_id, finished


def is_local(uri: str) -> bool:
    """True for a checkpoint on the local filesystem: a plain path or a ``file:`` URI."""
    scheme, sep, _ = uri.partition(":")
    return not sep or scheme.lower() == "file" or (len(scheme) == 1 and scheme.isalpha())  # C:\\... on Windows


def use_local_file_manager(spark: Any, checkpoint: str) -> bool:
    """Let Spark write a local checkpoint through :data:`LOCAL_FILE_MANAGER`; returns whether it will.

    Spark's default manager writes through Hadoop's ``FileContext``, whose local filesystem starts a
    ``readlink`` process for every file status it takes: four processes per file written, ~40 ms a file
    from a JVM of this size. A micro-batch writes its offset and commit logs on the driver and, per
    stateful operator and task, the state store's new files, so that was ~0.3 s of a 2 s micro-batch of
    the demo graph (docs/benchmarks.md, "Fixed cost per micro-batch"). The ``FileSystem``-based manager
    writes the same files the same way (a temporary file, then a rename) without them. Spark checks
    that a batch's log file does not exist before it renames instead of failing the rename, which
    differs only when two runs share one checkpoint at once, which Spark does not support either way.

    A manager chosen at the session's start (the launcher's or the pipeline's ``spark_conf``) is left
    as it is, and so is any checkpoint elsewhere (HDFS, object stores): there the default stays.
    """
    if spark.sparkContext.getConf().contains(FILE_MANAGER):
        return spark.conf.get(FILE_MANAGER) == LOCAL_FILE_MANAGER
    if is_local(checkpoint):
        spark.conf.set(FILE_MANAGER, LOCAL_FILE_MANAGER)
        return True
    spark.conf.unset(FILE_MANAGER)      # one session may run queries over several checkpoints
    return False


def filesystem(uri: str) -> tuple[Any, str]:
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute())
    scheme, rest = uri.split("://", 1)
    if scheme in ("s3a", "s3n"):
        uri = f"s3://{rest}"
    return pafs.FileSystem.from_uri(uri)


# --- epoch states of the sources' partitions (changelake.formats.sequence) ----------------------------

#: ``<checkpoint>/sequence_epochs/<batch id>.json``: every partition's epoch state after that batch,
#: ``{topic: {partition: PartitionEpoch as JSON}}``, written by the driver before the batch's Delta commits
EPOCHS_DIR = "sequence_epochs"
_EPOCH_FILES_KEPT = 20


def _epoch_files(checkpoint: str) -> tuple[Any, str, list[int]]:
    from pyarrow import fs as pafs

    fs, root = filesystem(checkpoint)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/{EPOCHS_DIR}", allow_not_found=True))
    except OSError:
        return fs, root, []
    ids = sorted((int(i.base_name[:-5]) for i in infos
                  if i.base_name.endswith(".json") and i.base_name[:-5].isdigit()), reverse=True)
    return fs, root, ids


#: ``<checkpoint>/sequence_epochs/start.json``: the epoch states a rebuilt checkpoint starts from (those of
#: the checkpoint it continues, :func:`carry_epochs`), under every batch's own
EPOCHS_START = "start"


def _read_epochs(fs: Any, root: str, batch_id: int | str) -> dict[str, dict[str, dict]]:
    try:
        with fs.open_input_stream(f"{root}/{EPOCHS_DIR}/{batch_id}.json") as f:
            data = json.loads(f.read().decode())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def epochs_at(checkpoint: str, wanted: dict[tuple[str, int], int]) -> dict[tuple[str, int], dict]:
    """Per (topic, partition), the epoch state (JSON) that holds at the offset asked for: from the newest
    file whose entry for it is not beyond that offset (a batch replayed after a crash finds the state its
    first run started from). Partitions with none are left out (they start at epoch 0)."""
    if not wanted:
        return {}
    fs, root, ids = _epoch_files(checkpoint)
    found: dict[tuple[str, int], dict] = {}
    for batch_id in ids:
        data = _read_epochs(fs, root, batch_id)
        for (topic, p), offset in wanted.items():
            entry = data.get(topic, {}).get(str(p))
            if (topic, p) not in found and isinstance(entry, dict) and int(entry.get("at", 0)) <= offset:
                found[(topic, p)] = entry
        if len(found) == len(wanted):
            break
    if len(found) < len(wanted):
        start = _read_epochs(fs, root, EPOCHS_START)
        for (topic, p), offset in wanted.items():
            entry = start.get(topic, {}).get(str(p))
            if (topic, p) not in found and isinstance(entry, dict) and int(entry.get("at", 0)) <= offset:
                found[(topic, p)] = entry
    return found


def carry_epochs(old: str, new: str, batch_id: int) -> None:
    """Start checkpoint ``new`` from the epoch states checkpoint ``old`` held after its batch ``batch_id``."""
    fs, root, ids = _epoch_files(old)
    at = next((i for i in ids if i <= batch_id), None)
    data = _read_epochs(fs, root, at) if at is not None else {}
    nfs, nroot = filesystem(new)
    nfs.create_dir(f"{nroot}/{EPOCHS_DIR}", recursive=True)
    with nfs.open_output_stream(f"{nroot}/{EPOCHS_DIR}/{EPOCHS_START}.json") as f:
        f.write(json.dumps(data, sort_keys=True).encode())


def write_epochs(checkpoint: str, batch_id: int, states: dict[tuple[str, int], dict]) -> None:
    """Record the partitions' epoch states after batch ``batch_id`` (on top of those of the batch before it)."""
    fs, root, ids = _epoch_files(checkpoint)
    earlier = next((i for i in ids if i < batch_id), None)
    data = _read_epochs(fs, root, earlier if earlier is not None else EPOCHS_START)
    for (topic, p), state in states.items():
        data.setdefault(topic, {})[str(p)] = state
    fs.create_dir(f"{root}/{EPOCHS_DIR}", recursive=True)
    tmp = f"{root}/{EPOCHS_DIR}/.{batch_id}.json.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(json.dumps(data, sort_keys=True).encode())
    fs.move(tmp, f"{root}/{EPOCHS_DIR}/{batch_id}.json")
    for old in [i for i in ids if i != batch_id][_EPOCH_FILES_KEPT:]:
        try:
            fs.delete_file(f"{root}/{EPOCHS_DIR}/{old}.json")
        except OSError:
            pass
