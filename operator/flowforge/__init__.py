"""FlowForge: a Kubernetes-native DAG workflow engine.

Layers, one way: ``flowforge.domain`` (pure) <- ``flowforge.store`` (PostgreSQL)
and ``flowforge.kube`` (Kubernetes API) <- ``flowforge.operator`` (kopf) and
``flowforge.cli``.
"""

__version__ = "0.1.0"
