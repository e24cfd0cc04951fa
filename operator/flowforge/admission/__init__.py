"""FlowForge's admission webhooks: a process of their own, beside the operator.

The webhook runs with other rights than the operator (it reads definitions, policies and
SubjectAccessReviews, and dry-runs Jobs; it never writes the store or creates anything real),
so it shares no module with `flowforge.operator` (an import-linter contract holds that).
From the top:

- `server`      the process: arguments, the store pool, kopf's registry of admission handlers
- `handlers`    the kopf validating/mutating handlers: a review in, a verdict out
- `transport`   the HTTPS server kopf serves them on: client certificates, connection caps
- `requester`   who asks, judged before anything is read for them
- `registry`, `run_sources`   read-only views of the store the decisions ask
- `access`, `dryrun`          who may ask for what; the dry-run creations of each task type
- `review`      the decisions themselves, pure over a review and the views above
- `guard`, `certs`            bounds on a review's body; the webhook's TLS material
"""
