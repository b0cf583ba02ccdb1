"""docs/real-database.md, run: its SQL, connector configuration, pipeline, ``changelake`` command and
comparison script, taken from the page's marked blocks (``<!-- realdb:NAME -->``), against a PostgreSQL,
a Kafka broker and a Connect worker started with the page's settings by this directory's fixtures.
Only the addresses and the password are replaced by the fixtures' own."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .lake import wait_for_marker

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "real-database.md"


def blocks() -> dict[str, str]:
    """The page's marked code blocks by name."""
    found = re.findall(r"<!-- realdb:(\S+) -->\n```\w+\n(.*?)```", PAGE.read_text(), flags=re.S)
    return {name: body for name, body in found}


def test_the_page_marks_every_block_the_test_runs() -> None:
    assert set(blocks()) == {"setup.sql", "connector.json", "pipeline.yaml", "changes.sql", "run", "compare.py"}


def test_try_it_with_a_real_database(debezium_postgres, pg_logical, connect_worker, kafka_bootstrap,
                                     tmp_path) -> None:
    page = blocks()
    pg_logical.execute("CREATE DATABASE inventory")
    pg = type(pg_logical)(pg_logical.root, pg_logical.host, pg_logical.port, dbname="inventory")
    pg.execute(page["setup.sql"])

    connector = json.loads(page["connector.json"])
    assert connector["database.port"] == "5432" and connector["database.password"] == "secret"
    connector.update({"database.port": str(pg.port), "database.password": pg.password})
    connect_worker.add_connector("inventory", connector)
    try:
        pg.execute(page["changes.sql"])
        pg.execute("CREATE TABLE marker (id int PRIMARY KEY, n int)", "INSERT INTO marker VALUES (1, 1)")
        wait_for_marker(kafka_bootstrap, "shop.public.marker", 1)   # every change before it is in Kafka

        (tmp_path / "pipeline.yaml").write_text(page["pipeline.yaml"].replace("127.0.0.1:9092", kafka_bootstrap))
        command = shlex.split(page["run"].strip())
        assert command[0] == "changelake"
        run = subprocess.run([sys.executable, "-m", "changelake.service.cli", *command[1:]], cwd=tmp_path,
                             capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, run.stderr[-4000:]

        script = page["compare.py"].replace("port=5432", f"port={pg.port}").replace("password=secret",
                                                                                     f"password={pg.password}")
        compared = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=120)
        assert compared.returncode == 0, compared.stderr[-4000:]
        assert compared.stdout.strip() == "3 rows, equal"
    finally:
        connect_worker.delete_connector("inventory")
