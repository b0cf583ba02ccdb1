"""A minimal Confluent Schema Registry for tests: GET /schemas/ids/<id> from a dict, 404 otherwise."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


@contextmanager
def schema_registry(schemas: Mapping[int, Any], *, authorization: list[str | None] | None = None,
                    bearer_token: str | None = None, tls: tuple[str, str] | None = None,
                    client_ca: str | None = None) -> Iterator[tuple[str, list[str]]]:
    """Serve ``schemas`` (id -> schema as JSON data; the dict may grow while it runs); yields the URL
    and the list of request paths. ``authorization`` collects each request's Authorization header.
    ``bearer_token``: a request without ``Authorization: Bearer <token>`` gets 401 (as a registry behind
    a token does). ``tls``: (certificate, key) PEM files: serve https; ``client_ca``: and require a client
    certificate signed by this CA."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            hits.append(self.path)
            if authorization is not None:
                authorization.append(self.headers.get("Authorization"))
            if bearer_token is not None and self.headers.get("Authorization") != f"Bearer {bearer_token}":
                self._reply(401, {"error_code": 40101, "message": "Unauthorized"})
                return
            prefix = "/schemas/ids/"
            sid = self.path[len(prefix):].split("?")[0] if self.path.startswith(prefix) else ""
            schema = schemas.get(int(sid)) if sid.isdigit() else None
            if schema is not None:
                self._reply(200, {"schema": json.dumps(schema)})
            else:
                self._reply(404, {"error_code": 40403, "message": "Schema not found"})

        def _reply(self, status: int, data: Any) -> None:
            body = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        if client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=client_ca)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_port}", hits
    finally:
        server.shutdown()
        server.server_close()
