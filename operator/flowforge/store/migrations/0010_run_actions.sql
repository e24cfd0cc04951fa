-- FlowForge schema 10: a person recovers a halted rollback (WorkflowRunAction,
-- flowforge.store.actions). The run keeps the phase it ended in while the recovered rollback
-- runs: recovering marks it (compensating stays for the rollback of a running run).
ALTER TABLE flowforge_run ADD COLUMN recovering boolean NOT NULL DEFAULT false;
