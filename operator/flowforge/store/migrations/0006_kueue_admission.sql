-- FlowForge schema 6: attempts that queue through Kueue. A task whose task type names a
-- Kueue LocalQueue has its Jobs created suspended; Kueue admits (unsuspends) them. While
-- the current attempt is not admitted the task is running in the store but Admitting to
-- people (status, CLI): admission_required marks such tasks (set when the run is created),
-- admitted_attempt is the attempt Kueue admitted (NULL again when it evicts the Job), and
-- admitted_at when. A new attempt is not admitted until its own Job is, with no column to
-- reset: admitted_attempt no longer equals attempt.
ALTER TABLE flowforge_task ADD COLUMN admission_required boolean NOT NULL DEFAULT false;
ALTER TABLE flowforge_task ADD COLUMN admitted_attempt integer CHECK (admitted_attempt >= 1);
ALTER TABLE flowforge_task ADD COLUMN admitted_at timestamptz;
