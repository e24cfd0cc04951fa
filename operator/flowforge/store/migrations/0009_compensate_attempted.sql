-- FlowForge schema 9: `compensateOn: Attempted` (flowforge.domain.undo). A compensator row
-- says whether it also undoes an attempted task (compensate_attempted, set when the run is
-- created) and, once the rollback triggered it, why it runs (undo_of: its
-- FLOWFORGE_UNDO_OF); a forward task's row says whether its last failed attempt had started
-- its container (last_attempt_started, written with the failure).
ALTER TABLE flowforge_task ADD COLUMN compensate_attempted boolean NOT NULL DEFAULT false;
ALTER TABLE flowforge_task ADD COLUMN last_attempt_started boolean NOT NULL DEFAULT false;
ALTER TABLE flowforge_task ADD COLUMN undo_of text
    CHECK (undo_of IN ('succeeded', 'attempted'));
