-- FlowForge schema 17: a person pauses and resumes a run (WorkflowRunAction Pause/Resume,
-- flowforge.store.pausing). While paused no task or compensator starts; a cancel asked
-- meanwhile is kept in deferred_cancel (its reason) and applied when the run is resumed.
ALTER TABLE flowforge_run
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN paused_at timestamptz,
    ADD COLUMN deferred_cancel text;

ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_paused_since
    CHECK (paused = (paused_at IS NOT NULL));

ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_deferred_cancel_only_while_paused
    CHECK (deferred_cancel IS NULL OR paused);
