"""Kubernetes access: Job manifests and a thin async API client."""
