-- FlowForge schema 3: the uid of each attempt's Job is recorded in the detail of its
-- task.job_created event ({"job": name, "created": bool, "uid": uid}). The operator reads
-- it back before it accepts an outcome, a vanished verdict or a cleanup of a Job (only the
-- Job it created counts), so the recorded Jobs of a run, and of one attempt, are found by
-- this index instead of a walk through the run's whole history.
-- serves: recorded_job_uid, recorded_jobs (and job_created_attempts)
CREATE INDEX flowforge_event_job_created_idx ON flowforge_event (run_id, task_key, attempt)
    WHERE kind = 'task.job_created';
