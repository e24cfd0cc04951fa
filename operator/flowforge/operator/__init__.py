"""The kopf operator: it runs each ready task as a Kubernetes Job, records every outcome in
the store and rolls failed runs back. `docs/architecture.md` is the map of its modules; the
admission webhooks are another process, in `flowforge.admission`."""
