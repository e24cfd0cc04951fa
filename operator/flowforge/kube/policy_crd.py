"""The FlowForgePolicy CRD: a namespaced policy, like a ResourceQuota, without status.

Generated with the other CRDs by `python -m flowforge.kube.crdgen` from the domain's schema
(`flowforge.domain.policy_spec`). The chart lets tenants read it, and only admins write it.
"""

from __future__ import annotations

from typing import Any

from flowforge.domain.api import POLICY_KIND, POLICY_PLURAL, POLICY_SHORT_NAME
from flowforge.domain.policy_spec import POLICY_SPEC_SCHEMA
from flowforge.kube.structural import column, crd, resource_schema, to_structural

Schema = dict[str, Any]


def flowforge_policy_crd() -> Schema:
    schema = resource_schema(
        kind=POLICY_KIND,
        description="What the Jobs of this namespace's workflows may use (ServiceAccounts, "
        "registries, tolerations, node selectors, Kueue queues and priority classes), the "
        "highest run priority, and lower caps; judged at admission and again before every "
        "Job. Written by cluster admins only; every FlowForgePolicy of a namespace applies.",
        spec=to_structural(POLICY_SPEC_SCHEMA),
        status={},
    )
    del schema["properties"]["status"]  # nothing reports on a policy
    del schema["required"]  # an empty spec is the default policy, spelt out
    columns = [
        column(
            "ServiceAccounts", "string", ".spec.serviceAccounts", "ServiceAccounts tasks may use."
        ),
        column("Registries", "string", ".spec.registries", "Image globs tasks may use."),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation."),
    ]
    policy = crd(
        kind=POLICY_KIND,
        plural=POLICY_PLURAL,
        short_name=POLICY_SHORT_NAME,
        schema=schema,
        columns=columns,
    )
    del policy["spec"]["versions"][0]["subresources"]  # no status subresource either
    return policy
