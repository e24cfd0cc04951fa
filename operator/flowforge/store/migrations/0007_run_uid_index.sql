-- FlowForge schema 7: runs found by their object's uid alone. A Job claims its run by uid
-- (its owner reference and labels), and a copy of a run's Job in another namespace is
-- reported on the run it claims; the identity index starts with the namespace, so without
-- this index that lookup scanned every run once per copied Job and reconciler pass.
-- serves: queries.RUN_BY_UID_QUERY
CREATE INDEX flowforge_run_uid_idx ON flowforge_run (uid);
