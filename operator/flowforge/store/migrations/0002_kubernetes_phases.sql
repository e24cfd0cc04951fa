-- FlowForge schema 2: run phases spelled as Kubernetes spells them (Pending, Running,
-- Succeeded, Failed, Cancelled), the values of flowforge.domain.states.RunPhase.
ALTER TABLE flowforge_run DROP CONSTRAINT flowforge_run_phase_check;
ALTER TABLE flowforge_run DROP CONSTRAINT flowforge_run_finished_iff_terminal;
ALTER TABLE flowforge_run DROP CONSTRAINT flowforge_run_compensating_only_while_running;
DROP INDEX flowforge_run_active_idx;

UPDATE flowforge_run SET phase = initcap(phase);

ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_phase_check
    CHECK (phase IN ('Pending', 'Running', 'Succeeded', 'Failed', 'Cancelled'));
ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_finished_iff_terminal
    CHECK ((finished_at IS NOT NULL) = (phase IN ('Succeeded', 'Failed', 'Cancelled')));
ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_compensating_only_while_running
    CHECK (NOT compensating OR phase = 'Running');
-- serves: list_active_runs (the reconciler's sweep over runs that are not finished)
CREATE INDEX flowforge_run_active_idx ON flowforge_run (id)
    WHERE phase IN ('Pending', 'Running');
