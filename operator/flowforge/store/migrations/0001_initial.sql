-- FlowForge schema 1: definitions, runs, task rows, dependency edges, events, the lease.
-- State values mirror flowforge.domain.states (tests/store/test_schema.py keeps them in sync).
-- Every index names the query it serves; store/README.md lists them with the functions.

CREATE TABLE flowforge_lease (
    name        text PRIMARY KEY,
    holder      text NOT NULL CHECK (holder <> ''),
    epoch       bigint NOT NULL CHECK (epoch >= 1),
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);

CREATE TABLE flowforge_definition (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace    text NOT NULL CHECK (namespace <> ''),
    workflow     text NOT NULL CHECK (workflow <> ''),
    version      integer NOT NULL CHECK (version >= 1),
    fingerprint  text NOT NULL CHECK (fingerprint ~ '^sha256:[0-9a-f]{64}$'),
    document     jsonb NOT NULL CHECK (jsonb_typeof(document) = 'object'),
    published_at timestamptz NOT NULL DEFAULT now(),
    -- serves: publish (the race winner), load_definition, list_versions, newest_version
    -- (ORDER BY version DESC LIMIT 1 is a backward scan of this index)
    CONSTRAINT flowforge_definition_identity UNIQUE (namespace, workflow, version)
);

CREATE TABLE flowforge_run (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace       text NOT NULL CHECK (namespace <> ''),
    name            text NOT NULL CHECK (name <> ''),
    uid             text NOT NULL CHECK (uid <> ''),
    definition_id   bigint NOT NULL REFERENCES flowforge_definition (id),
    parameters      jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(parameters) = 'object'),
    phase           text NOT NULL
        CHECK (phase IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    compensating    boolean NOT NULL DEFAULT false,
    cancel_requested boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    pruned_at       timestamptz,
    -- task counts kept when retention deletes the task rows: {"forward": {...}, ...}
    final_counts    jsonb,
    -- serves: get_run_by_identity, and makes create_run idempotent per Kubernetes object
    CONSTRAINT flowforge_run_identity UNIQUE (namespace, name, uid),
    CONSTRAINT flowforge_run_finished_iff_terminal
        CHECK ((finished_at IS NOT NULL) = (phase IN ('succeeded', 'failed', 'cancelled'))),
    CONSTRAINT flowforge_run_compensating_only_while_running
        CHECK (NOT compensating OR phase = 'running'),
    CONSTRAINT flowforge_run_pruned_only_when_finished
        CHECK (pruned_at IS NULL OR finished_at IS NOT NULL)
);

-- serves: list_active_runs (the reconciler's sweep over runs that are not finished)
CREATE INDEX flowforge_run_active_idx ON flowforge_run (id)
    WHERE phase IN ('pending', 'running');
-- serves: retention (finished runs older than a cutoff, not yet pruned)
CREATE INDEX flowforge_run_prunable_idx ON flowforge_run (finished_at)
    WHERE finished_at IS NOT NULL AND pruned_at IS NULL;

CREATE TABLE flowforge_task (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id               bigint NOT NULL REFERENCES flowforge_run (id),
    task_key             text NOT NULL CHECK (task_key <> ''),
    role                 text NOT NULL CHECK (role IN ('forward', 'compensation')),
    state                text NOT NULL,
    -- forward task this compensator undoes (compensation rows only)
    compensates_key      text,
    attempt              integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    max_attempts         integer NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds      integer CHECK (timeout_seconds >= 1),
    pending_dependencies integer NOT NULL DEFAULT 0 CHECK (pending_dependencies >= 0),
    -- position in the definition's topological order; compensation runs it backwards
    topological_index    integer NOT NULL CHECK (topological_index >= 0),
    not_before           timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    last_error           text,
    CONSTRAINT flowforge_task_state_matches_role CHECK (
        (role = 'forward' AND compensates_key IS NULL AND state IN
            ('waiting', 'ready', 'running', 'succeeded', 'failed', 'skipped', 'cancelled'))
        OR (role = 'compensation' AND compensates_key IS NOT NULL AND state IN
            ('not_triggered', 'pending', 'running', 'succeeded', 'failed', 'skipped'))
    ),
    CONSTRAINT flowforge_task_attempt_within_budget CHECK (attempt <= max_attempts),
    CONSTRAINT flowforge_task_released_only_without_pending_dependencies
        CHECK (state IN ('waiting', 'skipped', 'cancelled') OR pending_dependencies = 0),
    -- serves: every transition's lookup of (run, task key); the FK from events' task
    CONSTRAINT flowforge_task_identity UNIQUE (run_id, task_key)
);

-- serves: run_progress (one index-only GROUP BY per run)
CREATE INDEX flowforge_task_progress_idx ON flowforge_task (run_id, role, state);
-- serves: list_dispatchable_tasks / list_running_tasks (the reconciler: released tasks
-- without Jobs, running tasks whose Job may have finished or vanished)
CREATE INDEX flowforge_task_active_idx ON flowforge_task (state, not_before)
    WHERE state IN ('ready', 'running', 'pending');

-- the rollback runs strictly one compensator at a time: the database refuses a second
CREATE UNIQUE INDEX flowforge_task_one_running_compensator_idx ON flowforge_task (run_id)
    WHERE role = 'compensation' AND state = 'running';

CREATE TABLE flowforge_task_dependency (
    run_id      bigint NOT NULL REFERENCES flowforge_run (id),
    upstream_id bigint NOT NULL REFERENCES flowforge_task (id),
    task_id     bigint NOT NULL REFERENCES flowforge_task (id),
    CHECK (upstream_id <> task_id),
    -- serves: release of dependents and the transitive skip (edges out of an upstream)
    PRIMARY KEY (upstream_id, task_id)
);
-- serves: the foreign key's check when task rows are deleted by retention
CREATE INDEX flowforge_task_dependency_task_idx ON flowforge_task_dependency (task_id);
-- serves: retention's delete of a run's edges
CREATE INDEX flowforge_task_dependency_run_idx ON flowforge_task_dependency (run_id);

CREATE TABLE flowforge_event (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      bigint NOT NULL REFERENCES flowforge_run (id),
    task_key    text,
    attempt     integer CHECK (attempt >= 1),
    kind        text NOT NULL CHECK (kind ~ '^[a-z]+(\.[a-z_]+)+$'),
    epoch       bigint CHECK (epoch >= 1),
    detail      jsonb NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(detail) = 'object'),
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- serves: run_history (a run's events in order) and retention's delete
CREATE INDEX flowforge_event_run_idx ON flowforge_event (run_id, id);

-- the event history is append-only: nothing but retention deletes, nothing updates
CREATE FUNCTION flowforge_event_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'flowforge_event is append-only' USING ERRCODE = 'check_violation';
END;
$$;
CREATE TRIGGER flowforge_event_no_update BEFORE UPDATE ON flowforge_event
    FOR EACH ROW EXECUTE FUNCTION flowforge_event_is_append_only();
