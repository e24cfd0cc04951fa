-- FlowForge schema 15: the uid of the namespace a definition or run belongs to.
-- Rows are keyed by namespace *name*; a namespace deleted and re-created under the same name
-- is another namespace (another uid, perhaps another owner), whose readers must never be
-- shown the previous one's runs and parameters. The writer records the uid of the namespace
-- as it was when the row was written; readers show a row only when it matches the uid the
-- namespace has now (store/browse.py). NULL: written before this migration, or by a writer
-- that did not know the uid (shown as before: which namespace it belonged to is unknown).
-- (13 is left free for a parallel branch: migrate.py allows gaps.)
ALTER TABLE flowforge_definition
    ADD COLUMN namespace_uid text CHECK (namespace_uid <> '');
ALTER TABLE flowforge_run
    ADD COLUMN namespace_uid text CHECK (namespace_uid <> '');

-- A published definition's namespace uid never changes: migration 14's trigger refuses any
-- change of a published row, this column included.

-- A run's namespace uid never changes once written: a row trigger refuses the change to
-- every role (the operator updates runs all the time, never this column).
CREATE FUNCTION flowforge_run_namespace_uid_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.namespace_uid IS DISTINCT FROM NEW.namespace_uid
       OR OLD.namespace IS DISTINCT FROM NEW.namespace THEN
        RAISE EXCEPTION 'flowforge_run %: its namespace and namespace uid never change (role %)',
            OLD.id, current_user
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;
ALTER FUNCTION flowforge_run_namespace_uid_fixed() OWNER TO flowforge_migrator;
DO $search_path$
BEGIN
    EXECUTE format('ALTER FUNCTION flowforge_run_namespace_uid_fixed() SET search_path = %I, pg_temp',
                   current_schema());
END
$search_path$;
CREATE TRIGGER flowforge_run_namespace_fixed BEFORE UPDATE OF namespace, namespace_uid
    ON flowforge_run FOR EACH ROW EXECUTE FUNCTION flowforge_run_namespace_uid_fixed();
