"""Credentials in the configuration, format options included, are secret strings: they reach the
client that uses them and nothing that prints (validate, explain, dumps, reprs, logs)."""

from __future__ import annotations

import base64
import json
import pickle
import subprocess
import sys

import pytest
from pydantic import SecretStr

from changelake.formats import make_decoder
from changelake.service.config import parse_config
from changelake.service.explain import explain
from tests.formats.helpers import kinds, records
from tests.formats.test_debezium_avro import AFTER, ENVELOPE, frame
from tests.registry_stub import schema_registry

pytestmark = pytest.mark.unit

USER_INFO = "registry-user:r3g1stry-s3cret"
SASL = "k4fka-s3cret"
S3 = "s3-s3cret-key"
SECRETS = (USER_INFO.split(":")[1], SASL, S3)

PIPELINE = f"""
pipeline: {{id: inv, checkpoint: /tmp/ckpt}}
kafka: {{bootstrap_servers: "localhost:9092", properties: {{sasl.password: {SASL}}}}}
sources:
  - name: orders
    topics: [shop.orders]
    format: debezium-avro-confluent
    options: {{url: "REGISTRY", basic-auth.user-info: "{USER_INFO}", key: [id]}}
    table: orders
tables: [{{name: orders, primary_key: [id]}}]
storage: {{root: s3://lake, options: {{aws_secret_access_key: {S3}}}}}
"""


def _no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_format_option_credentials_are_secret_strings_everywhere_they_could_print():
    cfg = parse_config(PIPELINE, environ={})
    options = cfg.sources[0].options
    assert isinstance(options["basic-auth.user-info"], SecretStr) and options["url"] == "REGISTRY"
    assert options["basic-auth.user-info"].get_secret_value() == USER_INFO
    _no_secret(repr(cfg))
    _no_secret(str(cfg.redacted()))
    _no_secret(cfg.model_dump_json())
    _no_secret(explain(cfg))
    decoder = make_decoder("debezium-avro-confluent", options=options)
    _no_secret(repr(vars(decoder)))


def test_the_registry_gets_the_credential(tmp_path):
    seen: list[str | None] = []
    with schema_registry({42: ENVELOPE}, authorization=seen) as (url, _):
        cfg = parse_config(PIPELINE.replace("REGISTRY", url), environ={})
        decoder = make_decoder("debezium-avro-confluent", options=cfg.sources[0].options)
        decoder = pickle.loads(pickle.dumps(decoder))            # as Spark ships it to a worker
        assert kinds(decoder.decode(records([frame(42, "c", after=AFTER)])).rows) == ["+I"]
    assert seen == ["Basic " + base64.b64encode(USER_INFO.encode()).decode()]


def test_validate_and_explain_print_no_credential_even_with_errors_and_debug_logs(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    for argv in (["validate"], ["explain"]):
        out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "DEBUG", *argv,
                              "-c", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        _no_secret(out.stdout + out.stderr)
    path.write_text(PIPELINE.replace("table: orders\n", "table: orders\n    on_error: bogus\n")
                    .replace("sasl.password:", "sasl.passwrd:"))
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate", "-c", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "sources.0.on_error" in out.stderr
    _no_secret(out.stdout + out.stderr)


def test_json_logs_are_one_object_per_line():
    code = ("import logging\n"
            "from changelake.service.logs import configure_logging\n"
            "configure_logging('INFO', 'json')\n"
            "log = logging.getLogger('changelake.test')\n"
            "log.info('batch %d done', 7)\n"
            "try:\n    1 / 0\nexcept ZeroDivisionError:\n    log.exception('failed')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    assert [(r["level"], r["logger"], r["msg"]) for r in lines] == [
        ("INFO", "changelake.test", "batch 7 done"), ("ERROR", "changelake.test", "failed")]
    assert lines[0]["ts"].endswith("+00:00") and "ZeroDivisionError" in lines[1]["exception"]


@pytest.mark.parametrize("argv, env", [(["--log-format", "xml"], {}), ([], {"CHANGELAKE_LOG_FORMAT": "xml"})])
def test_an_unknown_log_format_is_rejected(tmp_path, argv, env):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", *argv, "validate", "-c", str(path)],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 2 and "xml" in out.stderr and "text, json" in out.stderr.replace("'", "")


def test_the_cli_logs_json_when_asked(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE)
    out = subprocess.run([sys.executable, "-c", "import logging, sys; from changelake.service import cli; "
                          "cli._dispatch = lambda args: logging.getLogger('changelake').warning('hi') or 0; "
                          "sys.exit(cli.main(['--log-format', 'json', 'validate', '-c', sys.argv[1]]))", str(path)],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CHANGELAKE_LOG_FORMAT": "json"})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stderr.strip())["msg"] == "hi"
