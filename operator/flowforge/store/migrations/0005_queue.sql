-- FlowForge schema 5: how much runs at once (flowforge.domain.queue). A run over a run limit
-- is 'Queued' (ordered by priority, then age); each run keeps the limits it was created with
-- (its definition's and its own), and the namespace's, copied from its FlowForgePolicy
-- objects by the operator, are one row per namespace. Every limit is decided under the
-- namespace's transaction-level advisory lock (store/queue.py).
ALTER TABLE flowforge_run DROP CONSTRAINT flowforge_run_phase_check;
ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_phase_check
    CHECK (phase IN ('Pending', 'Queued', 'Running', 'Succeeded', 'Failed', 'Cancelled'));

ALTER TABLE flowforge_run
    ADD COLUMN priority integer NOT NULL DEFAULT 0,
    -- first come first served: when the WorkflowRun was created (its creationTimestamp)
    ADD COLUMN submitted_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN max_parallel_tasks integer CHECK (max_parallel_tasks >= 1),
    -- the spec.concurrency key (workflow and the key's parameter values); NULL: none
    ADD COLUMN concurrency_key text,
    ADD COLUMN max_runs integer CHECK (max_runs >= 1),
    ADD COLUMN concurrency_policy text CHECK (concurrency_policy IN ('Queue', 'Forbid', 'Replace')),
    -- the limit that held it at the last look (flowforge.domain.queue.QueueReason)
    ADD COLUMN queue_reason text,
    ADD CONSTRAINT flowforge_run_concurrency_complete
        CHECK ((concurrency_key IS NULL) = (max_runs IS NULL)),
    ADD CONSTRAINT flowforge_run_queue_reason_only_while_queued
        CHECK (queue_reason IS NULL OR phase = 'Queued');

DROP INDEX flowforge_run_active_idx;
-- serves: list_active_runs (the reconciler's sweep over runs that are not finished)
CREATE INDEX flowforge_run_active_idx ON flowforge_run (id)
    WHERE phase IN ('Pending', 'Queued', 'Running');
-- serves: admit_locked (the namespace's queue in the order it is served) and queue positions
CREATE INDEX flowforge_run_queue_idx ON flowforge_run (namespace, priority DESC, submitted_at, id)
    WHERE phase = 'Queued';
-- serves: the running-run counts of a namespace and of a concurrency key, and the running
-- task count of a namespace (through its running runs)
CREATE INDEX flowforge_run_running_idx ON flowforge_run (namespace, concurrency_key, created_at)
    WHERE phase = 'Running';

CREATE TABLE flowforge_namespace_limits (
    namespace          text PRIMARY KEY CHECK (namespace <> ''),
    max_running_runs   integer CHECK (max_running_runs >= 1),
    max_running_tasks  integer CHECK (max_running_tasks >= 1),
    max_parallel_tasks integer CHECK (max_parallel_tasks >= 1),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
