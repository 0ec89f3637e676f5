"""Tracing is an optional feature: a process asked for OTLP tracing where OpenTelemetry is not
installed logs one error line and goes on untraced, instead of dying at start."""

from __future__ import annotations

import logging
import sys

import pytest

from services.common import tracing


@pytest.mark.parametrize("missing", ["opentelemetry.sdk.resources",
                                     "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"])
def test_otlp_tracing_without_opentelemetry_logs_an_error_and_stays_off(
        missing: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # `import` of it raises ImportError
    with caplog.at_level(logging.ERROR, logger="mmrl.tracing"):
        tracing.configure("env", "otlp")
    assert not tracing.enabled()
    assert [r.getMessage() for r in caplog.records if "mmrl[tracing]" in r.getMessage()]
    assert len(tracing.server_interceptors()) == 1  # metrics only


def test_tracing_off_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.resources", None)
    tracing.configure("env", "off")
    assert not tracing.enabled()
