"""Fixtures for the deployment-artefact tests.

The Helm chart is rendered by Helm's own Go engine through the
``helm-python-sdk`` package (import name ``helm_python``), which binds Helm
v4's SDK with ctypes; no ``helm`` binary or cluster is needed.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from deploy_support import CHART, NAMESPACE, RELEASE, split_manifests


@pytest.fixture(scope="session")
def helm() -> Any:
    try:
        import helm_python
    except ImportError as exc:  # pragma: no cover - depends on the environment
        pytest.skip(
            "Helm engine missing: the chart tests render with Helm's Go SDK through the "
            f"'helm-python-sdk' package (pip install helm-python-sdk==0.2.2); import failed: {exc}"
        )
    return helm_python


@pytest.fixture(scope="session")
def chart(helm: Any) -> Any:
    loaded = helm.Chart.load(str(CHART))
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def render_raw(chart: Any) -> Callable[..., dict[str, str]]:
    def _render(values: dict[str, Any] | None = None, *, name: str = RELEASE,
                namespace: str = NAMESPACE) -> dict[str, str]:
        return chart.render(values or {}, name=name, namespace=namespace, is_install=True)

    return _render


@pytest.fixture(scope="session")
def render(render_raw: Callable[..., dict[str, str]]) -> Callable[..., list[dict[str, Any]]]:
    """Render the chart with the real Helm engine and return the parsed manifests."""

    def _render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        return split_manifests(render_raw(values, **kwargs))

    return _render


@pytest.fixture(scope="session")
def exported() -> set[str]:
    from deploy_support import exported_metric_names

    return exported_metric_names()
