"""The FlowForgePolicy CRD: a namespaced policy, like a ResourceQuota, without status.

Generated with the other CRDs by `python -m flowforge.kube.crdgen` from the domain's schema
(`flowforge.domain.policy_spec`). The chart lets tenants read it, and only admins write it.
"""

from __future__ import annotations

from typing import Any

from flowforge.domain.api import (
    API_VERSION,
    CATEGORY,
    GROUP,
    POLICY_CRD,
    POLICY_KIND,
    POLICY_PLURAL,
    POLICY_SHORT_NAME,
    VERSION,
)
from flowforge.domain.policy_spec import POLICY_SPEC_SCHEMA
from flowforge.kube.crdgen import to_structural

Schema = dict[str, Any]


def _column(name: str, json_path: str, description: str, kind: str = "string") -> Schema:
    return {"name": name, "type": kind, "jsonPath": json_path, "description": description}


def flowforge_policy_crd() -> Schema:
    schema: Schema = {
        "type": "object",
        "description": "What the Jobs of this namespace's workflows may use (ServiceAccounts, "
        "registries, tolerations, node selectors) and lower caps. Written by cluster admins "
        "only; every FlowForgePolicy of a namespace applies.",
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": f"Versioned schema of this object: {API_VERSION}.",
            },
            "kind": {"type": "string", "description": f"The REST resource kind: {POLICY_KIND}."},
            "metadata": {"type": "object"},
            "spec": to_structural(POLICY_SPEC_SCHEMA),
        },
    }
    columns = [
        _column("ServiceAccounts", ".spec.serviceAccounts", "ServiceAccounts tasks may use."),
        _column("Registries", ".spec.registries", "Image globs tasks may use."),
        _column("Age", ".metadata.creationTimestamp", "Time since creation.", "date"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": POLICY_CRD},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": POLICY_KIND,
                "listKind": f"{POLICY_KIND}List",
                "plural": POLICY_PLURAL,
                "singular": POLICY_KIND.lower(),
                "shortNames": [POLICY_SHORT_NAME],
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
