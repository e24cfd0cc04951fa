-- FlowForge schema 24: what a namespace holds, for the FlowForgePolicy caps maxQueuedRuns and
-- maxTaskRows judged at run admission (admission/access.py). Each run counts its task rows
-- when its graph is written (store/runs.py), so a namespace's queued runs and held rows are
-- one index-only scan of its unfinished runs (store/holdings.py), never a count of tasks.
ALTER TABLE flowforge_run
    ADD COLUMN task_rows integer NOT NULL DEFAULT 0 CHECK (task_rows >= 0);

UPDATE flowforge_run AS run
SET task_rows = (SELECT count(*) FROM flowforge_task WHERE run_id = run.id)
WHERE phase IN ('Pending', 'Queued', 'Running');

-- serves: holdings.HOLDINGS_QUERY
CREATE INDEX flowforge_run_unfinished_idx ON flowforge_run (namespace) INCLUDE (phase, task_rows)
    WHERE phase IN ('Pending', 'Queued', 'Running');
