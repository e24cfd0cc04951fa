-- FlowForge schema 22: approval gates (flowforge.domain.approval). A gate is a forward
-- task row (approval = true) that never gets a Job: once its upstreams succeeded it is
-- 'awaiting' until people approve it (it succeeds), reject it or let it time out (it
-- fails). Its timeout (the gate's approval.timeoutSeconds) is in timeout_seconds and
-- counts from not_before, the time it was released. Approvals are WorkflowRunActions,
-- recorded in the run's history (flowforge_event, action.accepted); the run's creator
-- (flowforge.io/requested-by) is kept on the run for forbidSelf.
ALTER TABLE flowforge_task ADD COLUMN approval boolean NOT NULL DEFAULT false;

ALTER TABLE flowforge_task DROP CONSTRAINT flowforge_task_state_matches_role;
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_state_matches_role CHECK (
    (role = 'forward' AND compensates_key IS NULL AND state IN
        ('waiting', 'ready', 'awaiting', 'running', 'succeeded', 'failed', 'skipped',
         'cancelled'))
    OR (role = 'compensation' AND compensates_key IS NOT NULL AND state IN
        ('not_triggered', 'pending', 'running', 'succeeded', 'failed', 'skipped'))
);
-- only a gate awaits, and a gate never runs a Job
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_only_gates_await
    CHECK (approval OR state <> 'awaiting');
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_gates_never_run
    CHECK (NOT approval OR (role = 'forward' AND state <> 'running' AND state <> 'ready'));

ALTER TABLE flowforge_run ADD COLUMN requested_by text;
