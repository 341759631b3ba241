"""A real OTLP/HTTP trace receiver, run as its own process by the trace test:
`python -m tests.functional.otlp_receiver OUT.jsonl` prints its port, then writes each span it is
sent (protobuf, decoded with opentelemetry-proto) as one JSON line, until it is terminated."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def spans(body: bytes) -> list[dict[str, Any]]:
    req = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in req.resource_spans:
        service = {a.key: _value(a.value) for a in rs.resource.attributes}.get("service.name")
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append({"service": service, "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(), "kind": s.kind, "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano, "status": s.status.code,
                            "attributes": {a.key: _value(a.value) for a in s.attributes}})
    return out


def main() -> None:
    out_path = sys.argv[1]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            assert self.headers.get("Content-Type") == "application/x-protobuf"
            with open(out_path, "a") as f:
                for s in spans(body):
                    f.write(json.dumps(s) + "\n")
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
