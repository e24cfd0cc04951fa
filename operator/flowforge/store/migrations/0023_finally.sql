-- FlowForge schema 23: `finally` tasks (flowforge.domain.final_tasks). Their rows have the
-- role 'finally' and run one at a time in topological_index order (their list order) once
-- the run's outcome is decided: the run keeps its phase (Running) with finalizing set, the
-- decided phase in final_phase and how its rollback ended in rollback_outcome, and takes
-- final_phase when the last of them has run (store/final_tasks.py).
ALTER TABLE flowforge_task DROP CONSTRAINT flowforge_task_role_check;
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_role_check
    CHECK (role IN ('forward', 'compensation', 'finally'));

ALTER TABLE flowforge_task DROP CONSTRAINT flowforge_task_state_matches_role;
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_state_matches_role CHECK (
    (role = 'forward' AND compensates_key IS NULL AND state IN
        ('waiting', 'ready', 'awaiting', 'running', 'succeeded', 'failed', 'skipped',
         'cancelled'))
    OR (role = 'compensation' AND compensates_key IS NOT NULL AND state IN
        ('not_triggered', 'pending', 'running', 'succeeded', 'failed', 'skipped'))
    OR (role = 'finally' AND compensates_key IS NULL AND state IN
        ('waiting', 'ready', 'running', 'succeeded', 'failed', 'skipped'))
);

ALTER TABLE flowforge_run
    ADD COLUMN finalizing boolean NOT NULL DEFAULT false,
    ADD COLUMN final_phase text CHECK (final_phase IN ('Succeeded', 'Failed', 'Cancelled')),
    ADD COLUMN rollback_outcome text CHECK (rollback_outcome IN ('None', 'Completed', 'Halted'));

ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_finalizing_knows_its_phase
    CHECK (NOT finalizing OR final_phase IS NOT NULL);
