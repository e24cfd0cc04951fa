"""FlowForge's Kubernetes API by name: group, version, kinds, plurals, and the keys it owns.

Every Python module that names a FlowForge resource or a ``flowforge.io/`` key imports it from
here (the CRDs in ``crds/`` are generated from these names; the Helm chart's templates spell
them in YAML). Changing a value here is an API change: a new version, not an edit.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "flowforge.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
CATEGORY: Final = "flowforge"  # `kubectl get flowforge` lists every kind

DEFINITION_KIND: Final = "WorkflowDefinition"
DEFINITION_PLURAL: Final = "workflowdefinitions"
DEFINITION_SHORT_NAME: Final = "wfd"
DEFINITION_CRD: Final = f"{DEFINITION_PLURAL}.{GROUP}"

RUN_KIND: Final = "WorkflowRun"
RUN_PLURAL: Final = "workflowruns"
RUN_SHORT_NAME: Final = "wfr"
RUN_CRD: Final = f"{RUN_PLURAL}.{GROUP}"

# Labels, annotations and the finalizer FlowForge puts on objects are all `PREFIX/<name>`;
# kopf's own bookkeeping annotations use the same prefix.
PREFIX: Final = GROUP
FINALIZER: Final = f"{PREFIX}/finalizer"
# Retired: a retry is `spec.retryOf` (checked at admission); admission refuses a new run that
# still carries this annotation, and the operator ignores it.
RETRY_OF_ANNOTATION: Final = f"{PREFIX}/retry-of"
# Set on every new run by the mutating webhook to the requesting user; nobody else may set or
# change it (the validating webhook refuses that). The operator records it with a retry.
REQUESTED_BY_ANNOTATION: Final = f"{PREFIX}/requested-by"
# "true" on a run being deleted: skip the rollback and let the object go at once.
FORCE_DELETE_ANNOTATION: Final = f"{PREFIX}/force-delete"

# Written by cluster admins only (as a ResourceQuota); read by admission.
POLICY_KIND: Final = "FlowForgePolicy"
POLICY_PLURAL: Final = "flowforgepolicies"
POLICY_SHORT_NAME: Final = "ffpolicy"
POLICY_CRD: Final = f"{POLICY_PLURAL}.{GROUP}"

# The start of a definition's status message when the operator could not publish it; the
# webhook reads it to leave such a definition out of the versions it compares against.
NOT_PUBLISHED: Final = "not published"
