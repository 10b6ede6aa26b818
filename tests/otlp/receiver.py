"""An OTLP/HTTP trace receiver for the tests: decodes each POST /v1/traces
(ExportTraceServiceRequest, protobuf, optionally gzip) with the opentelemetry-proto package and
keeps its spans; GET /spans answers them as JSON. POST /fail?status=N makes every export answer N
from then on (0: accept again); GET /posts answers how many exports were POSTed. Binds 127.0.0.1
on a free port and prints it.

    python receiver.py            (prints "port <n>" once listening)
"""
import gzip
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPANS = []
LOCK = threading.Lock()
STATE = {"fail": 0, "posts": 0}


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path.startswith("/fail?status="):
            with LOCK:
                STATE["fail"] = int(self.path.split("=", 1)[1])
            self.answer(200, b"")
            return
        if self.path == "/v1/traces":
            with LOCK:
                STATE["posts"] += 1
                fail = STATE["fail"]
            if fail:
                self.answer(fail, b"")
                return
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        got = []
        for rs in request.resource_spans:
            resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    got.append(
                        {
                            "name": sp.name,
                            "kind": sp.kind,
                            "trace_id": sp.trace_id.hex(),
                            "span_id": sp.span_id.hex(),
                            "parent_span_id": sp.parent_span_id.hex(),
                            "status": sp.status.code,
                            "attributes": {kv.key: any_value(kv.value) for kv in sp.attributes},
                            "service": resource.get("service.name"),
                            "content_type": self.headers.get("Content-Type"),
                            "x_test": self.headers.get("X-Test"),
                        }
                    )
        with LOCK:
            SPANS.extend(got)
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def answer(self, status, out):
        self.send_response(status)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        with LOCK:
            out = json.dumps(STATE["posts"] if self.path == "/posts" else SPANS).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()
