"""Reading a Spark streaming checkpoint from outside the query: its offset and commit logs.

``<checkpoint>/offsets/<batch id>``: a version line, the batch's metadata (JSON), then one line per
source with the offsets the batch ends at (the Kafka source's ``{topic: {partition: offset}}``).
``<checkpoint>/commits/<batch id>`` exists once the batch is done. Both are written by Spark; this
module only reads them (local paths, or object-store URIs pyarrow knows: s3a:// is read as s3://).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

Offsets = dict[str, dict[str, int]]


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


def filesystem(uri: str) -> tuple[Any, str]:
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute())
    scheme, rest = uri.split("://", 1)
    if scheme in ("s3a", "s3n"):
        uri = f"s3://{rest}"
    return pafs.FileSystem.from_uri(uri)
