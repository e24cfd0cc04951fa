"""Where the Kubernetes API is and how this process signs in: a kubeconfig file when one is
named, else the Pod's ServiceAccount (in a cluster), else the default kubeconfig."""

from __future__ import annotations

from kubernetes import client as k8s
from kubernetes import config as k8s_config


def load_configuration(kubeconfig: str | None = None) -> k8s.Configuration:
    configuration = k8s.Configuration()
    if kubeconfig:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
        return configuration
    try:
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    except k8s_config.ConfigException:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    return configuration
