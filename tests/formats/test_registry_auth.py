"""debezium-avro-confluent against a Schema Registry behind https (a CA file, a client certificate) and
a bearer token (from the configuration, a ``_file`` or the environment): the token reaches the registry
and nothing that prints; a wrong setting is a ConfigError that names the option."""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import pickle
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from changelake.errors import ConfigError, SourceError
from changelake.formats import make_decoder
from changelake.service.config import parse_config
from tests.formats.helpers import kinds, records
from tests.formats.test_debezium_avro import AFTER, ENVELOPE, frame
from tests.registry_stub import schema_registry

pytestmark = pytest.mark.unit

TOKEN = "t0ken-s3cret-for-the-registry"


def _cert(name: str, key, issuer_name: x509.Name, issuer_key, *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.timezone.utc)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, str]:
    """A CA made for the test, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "changelake test CA")])
    ca = _cert("changelake test CA", ca_key, ca_name, ca_key, ca=True)
    out = {"ca": str(d / "ca.pem")}
    Path(out["ca"]).write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(who, key, ca_name, ca_key, ca=False)
        out[who] = str(d / f"{who}.pem")
        out[f"{who}_key"] = str(d / f"{who}.key")
        Path(out[who]).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(out[f"{who}_key"]).write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                              serialization.PrivateFormat.PKCS8,
                                                              serialization.NoEncryption()))
    return out


def _decode(options: dict) -> list[str]:
    decoder = make_decoder("debezium-avro-confluent", options=options)
    decoder = pickle.loads(pickle.dumps(decoder))            # as Spark ships it to a worker
    return kinds(decoder.decode(records([frame(42, "c", after=AFTER)])).rows)


def test_https_registry_with_a_ca_file(pki):
    with schema_registry({42: ENVELOPE}, tls=(pki["server"], pki["server_key"])) as (url, hits):
        assert url.startswith("https://")
        assert _decode({"url": url, "ssl.ca.location": pki["ca"]}) == ["+I"]
        with pytest.raises(SourceError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            _decode({"url": url})                          # the system's CAs do not know the test CA
    assert hits == ["/schemas/ids/42"]


def test_https_registry_that_requires_a_client_certificate(pki):
    with schema_registry({42: ENVELOPE}, tls=(pki["server"], pki["server_key"]), client_ca=pki["ca"]) as (url, _):
        assert _decode({"url": url, "ssl.ca.location": pki["ca"], "ssl.certificate.location": pki["client"],
                        "ssl.key.location": pki["client_key"]}) == ["+I"]
        with pytest.raises(SourceError):
            _decode({"url": url, "ssl.ca.location": pki["ca"]})


def test_bearer_token_from_a_secret_file_reaches_the_registry_and_no_log(pki, tmp_path, caplog):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    seen: list[str | None] = []
    caplog.set_level(logging.DEBUG)
    with schema_registry({42: ENVELOPE}, authorization=seen, bearer_token=TOKEN,
                         tls=(pki["server"], pki["server_key"])) as (url, _):
        config = parse_config(f"""
pipeline: {{id: inv, checkpoint: /tmp/ckpt}}
kafka: {{bootstrap_servers: "localhost:9092"}}
sources:
  - name: orders
    topics: [shop.orders]
    format: debezium-avro-confluent
    options: {{url: "{url}", bearer-auth.token_file: "{token_file}", ssl.ca.location: "{pki['ca']}", key: [id]}}
    table: orders
tables: [{{name: orders, primary_key: [id]}}]
""", environ={})
        options = config.sources[0].options
        assert TOKEN not in repr(config) + config.model_dump_json() + str(config.redacted())
        decoder = make_decoder("debezium-avro-confluent", options=options)
        assert TOKEN not in repr(vars(decoder))
        assert _decode(options) == ["+I"]
        with pytest.raises(SourceError, match="refused the credentials .*bearer-auth.token") as refused:
            _decode({**options, "bearer-auth.token": "wrong"})
        assert "wrong" not in str(refused.value)
    assert seen[0] == f"Bearer {TOKEN}"
    assert TOKEN not in caplog.text


def test_bearer_token_from_the_environment():
    config = parse_config("""
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - name: orders
    topics: [shop.orders]
    format: debezium-avro-confluent
    options: {url: "https://registry:8081", bearer-auth.token: "${REGISTRY_TOKEN}", key: [id]}
    table: orders
tables: [{name: orders, primary_key: [id]}]
""", environ={"REGISTRY_TOKEN": TOKEN})
    token = config.sources[0].options["bearer-auth.token"]
    assert token.get_secret_value() == TOKEN and TOKEN not in repr(config)


@pytest.mark.parametrize("options, message", [
    ({"url": "https://r", "basic-auth.user-info": "u:p", "bearer-auth.token": "t"}, "not both"),
    ({"url": "https://r", "bearer-auth.logical-cluster": "lsrc-1"}, "set the token"),
    ({"url": "https://r", "ssl.key.location": "/k.pem"}, "need ssl.certificate.location"),
    ({"url": "http://r", "ssl.ca.location": "/ca.pem"}, "not https://"),
])
def test_settings_the_client_cannot_use_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        make_decoder("debezium-avro-confluent", options=options)


def test_a_missing_ca_file_is_a_config_error_naming_the_option(tmp_path):
    with pytest.raises(ConfigError, match="ssl.ca.location"):
        _decode({"url": "https://127.0.0.1:9", "ssl.ca.location": str(tmp_path / "missing.pem")})
