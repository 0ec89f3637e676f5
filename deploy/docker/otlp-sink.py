"""A stand-in trace collector for `make compose-check` where no registry serves Jaeger's image: an
OTLP/gRPC receiver on :4317 that keeps, for every trace it receives, the services and span names in
it, rewritten as JSON to one file after each export (default /tmp/traces.json). It runs on the
coordinator image, which carries the OpenTelemetry packages (deploy/docker/compose-trace-sink.yml)."""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/traces.json"


class TraceSink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.traces: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC method's name
        with self.lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "unknown")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        trace = self.traces.setdefault(span.trace_id.hex(), {"services": [], "spans": []})
                        trace["services"] = sorted({*trace["services"], service})
                        trace["spans"].append(f"{service}: {span.name}")
            tmp = f"{OUT}.tmp"
            with open(tmp, "w") as out:
                json.dump(self.traces, out)
            os.replace(tmp, OUT)
        return trace_service_pb2.ExportTraceServiceResponse()


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceSink(), server)
    server.add_insecure_port("[::]:4317")
    server.start()
    print(f"otlp-sink: listening on :4317, writing {OUT}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
