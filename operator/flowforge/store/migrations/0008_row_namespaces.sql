-- FlowForge schema 8: task and event rows carry their run's namespace, so row-level security
-- compares a column with the reader's namespaces, evaluated once per statement, instead of
-- looking up the run (and calling a function) for every row. Reading a 10,000-task run as
-- the server cost 4x what it cost the owner.
--
-- The guarantee is unchanged: a reporting login (and the server, within the scope of its
-- transaction) reads a task or event row exactly when it may read its run's namespace. The
-- namespace of a row is its run's, held so by the database: the foreign key to the run is
-- (run_id, namespace) -> (id, namespace), replacing the one on run_id alone, so a row
-- labelled with another namespace than its run's cannot be written. The store writes the
-- column where it inserts the rows (store/runs.py, store/events.py and the statements that
-- record events).

-- 1. The column, filled from the runs (history is append-only: its update trigger is held
--    off for the backfill alone, inside this migration's transaction).
ALTER TABLE flowforge_run ADD CONSTRAINT flowforge_run_id_namespace UNIQUE (id, namespace);

ALTER TABLE flowforge_task ADD COLUMN namespace text;
UPDATE flowforge_task AS task SET namespace = run.namespace
FROM flowforge_run AS run WHERE run.id = task.run_id;
ALTER TABLE flowforge_task ALTER COLUMN namespace SET NOT NULL;
ALTER TABLE flowforge_task DROP CONSTRAINT flowforge_task_run_id_fkey;
ALTER TABLE flowforge_task ADD CONSTRAINT flowforge_task_run_fkey
    FOREIGN KEY (run_id, namespace) REFERENCES flowforge_run (id, namespace);

ALTER TABLE flowforge_event ADD COLUMN namespace text;
ALTER TABLE flowforge_event DISABLE TRIGGER flowforge_event_no_update;
UPDATE flowforge_event AS event SET namespace = run.namespace
FROM flowforge_run AS run WHERE run.id = event.run_id;
ALTER TABLE flowforge_event ENABLE TRIGGER flowforge_event_no_update;
ALTER TABLE flowforge_event ALTER COLUMN namespace SET NOT NULL;
ALTER TABLE flowforge_event DROP CONSTRAINT flowforge_event_run_id_fkey;
ALTER TABLE flowforge_event ADD CONSTRAINT flowforge_event_run_fkey
    FOREIGN KEY (run_id, namespace) REFERENCES flowforge_run (id, namespace);

-- 2. The namespaces the current role may read, once per statement: its grants ('*' for
--    every namespace), and for a member of flowforge_server those of the current
--    transaction's scope it is granted (never '*'; no valid scope reads nothing). Same rules
--    as schema 4's flowforge_may_read_namespace, which it replaces. Not SECURITY DEFINER: it
--    runs as the reader, whose own grant rows the policy on flowforge_reporting_grant shows.
CREATE FUNCTION flowforge_readable_namespaces() RETURNS text[]
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT pg_catalog.pg_has_role(current_user, 'flowforge_server', 'USAGE') THEN
            ARRAY(SELECT g.namespace FROM flowforge_reporting_grant AS g
                  WHERE g.grantee = current_user)
        WHEN coalesce(split_part(pg_catalog.current_setting('flowforge.namespaces', true), '|', 1)
                      = extract(epoch FROM pg_catalog.transaction_timestamp())::text, false) THEN
            ARRAY(SELECT scoped FROM unnest(string_to_array(split_part(
                      pg_catalog.current_setting('flowforge.namespaces', true), '|', 2), ','))
                      AS scoped
                  WHERE scoped <> '*' AND EXISTS (
                      SELECT FROM flowforge_reporting_grant AS g
                      WHERE g.grantee = current_user AND g.namespace IN (scoped, '*')))
        ELSE '{}'::text[]
    END
$$;
ALTER FUNCTION flowforge_readable_namespaces() OWNER TO flowforge_migrator;
-- resolve names in this schema only (a reader's temporary table named like the grants must
-- not stand in for them)
DO $search_path$
BEGIN
    EXECUTE format('ALTER FUNCTION flowforge_readable_namespaces() SET search_path = %I, pg_temp',
                   current_schema());
END
$search_path$;
REVOKE ALL ON FUNCTION flowforge_readable_namespaces() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION flowforge_readable_namespaces() TO flowforge_reporting;

-- 3. The policies: the (SELECT ...) is an InitPlan, computed once per statement.
DROP POLICY flowforge_definition_reporting ON flowforge_definition;
DROP POLICY flowforge_run_reporting ON flowforge_run;
DROP POLICY flowforge_task_reporting ON flowforge_task;
DROP POLICY flowforge_event_reporting ON flowforge_event;
DROP FUNCTION flowforge_may_read_namespace(text);
DO $policies$
DECLARE
    table_name text;
BEGIN
    FOREACH table_name IN ARRAY ARRAY[
        'flowforge_definition', 'flowforge_run', 'flowforge_task', 'flowforge_event'
    ] LOOP
        EXECUTE format(
            'CREATE POLICY %I ON %I FOR SELECT TO flowforge_reporting USING ('
            'namespace = ANY ((SELECT flowforge_readable_namespaces())::text[]) '
            'OR ''*'' = ANY ((SELECT flowforge_readable_namespaces())::text[]))',
            table_name || '_reporting', table_name);
    END LOOP;
END
$policies$;
-- edges (no namespace column) stay visible when their run is, under the run's policy above
