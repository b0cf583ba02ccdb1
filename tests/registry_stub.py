"""A minimal Confluent Schema Registry for tests: GET /schemas/ids/<id> from a dict, 404 otherwise."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


@contextmanager
def schema_registry(schemas: Mapping[int, Any], *, authorization: list[str | None] | None = None
                    ) -> Iterator[tuple[str, list[str]]]:
    """Serve ``schemas`` (id -> schema as JSON data; the dict may grow while it runs); yields the URL
    and the list of request paths. ``authorization`` collects each request's Authorization header."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server API
            hits.append(self.path)
            if authorization is not None:
                authorization.append(self.headers.get("Authorization"))
            prefix = "/schemas/ids/"
            sid = self.path[len(prefix):].split("?")[0] if self.path.startswith(prefix) else ""
            schema = schemas.get(int(sid)) if sid.isdigit() else None
            if schema is not None:
                body, status = json.dumps({"schema": json.dumps(schema)}).encode(), 200
            else:
                body, status = json.dumps({"error_code": 40403, "message": "Schema not found"}).encode(), 404
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", hits
    finally:
        server.shutdown()
        server.server_close()
