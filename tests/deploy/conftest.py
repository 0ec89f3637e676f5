from __future__ import annotations

from typing import Any

import pytest
from deploy_contract import K8S_DIR, load_yaml_documents, run_tool

KUSTOMIZATIONS = {
    "base": K8S_DIR / "base",
    "local": K8S_DIR / "overlays" / "local",
    "hyperpod": K8S_DIR / "overlays" / "hyperpod",
    "local-pools": K8S_DIR / "overlays" / "local-pools",
}


@pytest.fixture(scope="session")
def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization rendered by a real, offline `kubectl kustomize`, as parsed objects."""
    return {
        name: load_yaml_documents(run_tool("kubectl", "kustomize", str(path)))
        for name, path in KUSTOMIZATIONS.items()
    }
