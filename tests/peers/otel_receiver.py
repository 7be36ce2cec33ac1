#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for gatehouse's tests: decodes what arrives with the
`opentelemetry-proto` protobuf classes (PyPI), nothing of gatehouse's.

Usage: otel_receiver.py [--tls CERT KEY]   (--tls: OTLP/HTTPS with that PEM certificate and key)
Listens on 127.0.0.1 (an ephemeral port) and prints, one JSON object per line on stdout:
    {"listening": PORT}                                           first
    {"request": {"path":..., "content_type":..., "headers": {lower-name: value}, "spans": N,
                 "status": CODE}}                                 per POST
    {"span": {"trace_id", "span_id", "parent_span_id", "name", "kind", "flags", "trace_state",
              "attributes": {k: v}, "links": [{"trace_id","span_id"}],
              "status": {"code", "message"}, "resource": {k: v}, "scope": name}}   per span
Spans are printed only for requests answered 200. A gzip `Content-Encoding` is decoded first.

Its mode is set by `POST /mode` with a body of `ok` (answer 200, the default), `503` (answer
503 to every export) or `stall` (hold every export 30 s, then 503). `GET /healthz` answers 200.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

MODE = {"mode": "ok"}
OUT = threading.Lock()


def emit(obj) -> None:
    with OUT:
        sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
        sys.stdout.flush()


def any_value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: stdout is the report
        pass

    def answer(self, code: int, body: bytes = b"", ctype: str = "application/x-protobuf") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.answer(200 if self.path == "/healthz" else 404, b"ok", "text/plain")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path == "/mode":
            MODE["mode"] = body.decode().strip()
            self.answer(200, b"ok", "text/plain")
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        req = trace_service_pb2.ExportTraceServiceRequest()
        try:
            # A collector in front (Rotel) posts gzip-compressed protobuf.
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            req.ParseFromString(body)
        except Exception as e:  # noqa: BLE001
            emit({"request": {"path": self.path, "error": str(e), "headers": headers}})
            self.answer(400)
            return
        n = sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        mode = MODE["mode"]
        if mode == "stall":
            time.sleep(30)
        status = 200 if mode == "ok" else 503
        emit({"request": {"path": self.path, "content_type": headers.get("content-type"),
                          "headers": headers, "spans": n, "status": status}})
        if status == 200:
            for rs in req.resource_spans:
                resource = attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        emit({"span": {
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "flags": s.flags,
                            "trace_state": s.trace_state,
                            "attributes": attrs(s.attributes),
                            "links": [{"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                                      for l in s.links],
                            "status": {"code": s.status.code, "message": s.status.message},
                            "resource": resource,
                            "scope": ss.scope.name,
                        }})
        reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.answer(status, reply)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if len(sys.argv) == 4 and sys.argv[1] == "--tls":
        # OTLP/HTTPS (tests/shipped, issue 46): `--tls CERT KEY` (PEM files).
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[2], sys.argv[3])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    emit({"listening": server.server_address[1]})
    server.serve_forever()


if __name__ == "__main__":
    main()
