"""FlowForge: a Kubernetes-native DAG workflow engine.

Layers, one way: ``flowforge.domain`` (pure) <- ``flowforge.store`` (PostgreSQL),
``flowforge.kube`` (Kubernetes API) and ``flowforge.sdk`` (authoring) <- ``flowforge.operator``
(kopf) and ``flowforge.cli`` <- ``flowforge.localdev`` (``make dev``: runs all of it locally).
The import-linter contracts in pyproject.toml enforce it (``make lint``).
"""

__version__ = "0.1.0"
