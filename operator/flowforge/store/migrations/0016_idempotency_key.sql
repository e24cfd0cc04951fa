-- FlowForge schema 16: a run's spec.idempotencyKey (flowforge.store.runs). A run whose key
-- matches an earlier run of its namespace does not execute: it is that run's duplicate
-- (duplicate_of), shows its result once it has one, and is never itself the original.
ALTER TABLE flowforge_run
    ADD COLUMN idempotency_key text,
    ADD COLUMN duplicate_of bigint REFERENCES flowforge_run (id);

ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_duplicate_has_key
    CHECK (duplicate_of IS NULL OR idempotency_key IS NOT NULL);

-- the latest original of a key in a namespace, found in create_run under the namespace lock
CREATE INDEX flowforge_run_idempotency_key ON flowforge_run (namespace, idempotency_key, id)
    WHERE idempotency_key IS NOT NULL AND duplicate_of IS NULL;
