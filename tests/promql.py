"""Reading the Grafana dashboard's PromQL queries: which metric names each one selects (shared by the
static dashboard check and the end-to-end scrape)."""

from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "mmrl-dashboard.json"
PROMQL_WORDS = {"sum", "by", "without", "rate", "irate", "increase", "histogram_quantile", "avg", "max", "min",
                "count", "le", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset"}
PROMETHEUS_OWN = {"up"}  # written by Prometheus itself for every target


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and numbers left out)."""
    expr = re.sub(r'"[^"]*"', "", expr)  # strings, e.g. label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    tokens = [m.group() for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", expr)
              if not expr[m.end():].lstrip().startswith("(")]  # a function call
    return {t for t in tokens if t not in PROMQL_WORDS}


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
