"""What every service's `main` calls before serving: tracing as configured (tracing.py), then the
Prometheus metrics endpoint (metrics.py)."""

from __future__ import annotations

from services.common import tracing
from services.common.metrics import serve_metrics


def start_observability(service: str, metrics_port: int, tracing_mode: str, host: str = "0.0.0.0") -> None:
    """Tracing as configured, then the metrics endpoint (port 0: none)."""
    tracing.configure(service, tracing_mode)  # type: ignore[arg-type]
    serve_metrics(metrics_port, host)
