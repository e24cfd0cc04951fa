-- FlowForge schema 15: the uid of the namespace a definition or run belongs to.
-- Rows are keyed by namespace *name*; a namespace deleted and re-created under the same name
-- is another namespace (another uid, perhaps another owner), whose readers must never be
-- shown the previous one's runs and parameters. The writer records the uid of the namespace
-- as it was when the row was written; readers show a row only when it matches the uid the
-- namespace has now (store/browse.py). NULL: written before this migration, or by a writer
-- that did not know the uid (shown as before: which namespace it belonged to is unknown).
-- Numbered 15 (not 13) so that a parallel branch's 13 does not collide (migrate.py allows gaps).
ALTER TABLE flowforge_definition
    ADD COLUMN namespace_uid text CHECK (namespace_uid <> '');
ALTER TABLE flowforge_run
    ADD COLUMN namespace_uid text CHECK (namespace_uid <> '');

-- A published definition's namespace uid is part of its identity: immutable like the rest
-- (migration 14's trigger function, now comparing it too).
CREATE OR REPLACE FUNCTION flowforge_definition_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF (OLD.id, OLD.namespace, OLD.workflow, OLD.version, OLD.fingerprint, OLD.document,
            OLD.published_at, OLD.namespace_uid)
           IS DISTINCT FROM
           (NEW.id, NEW.namespace, NEW.workflow, NEW.version, NEW.fingerprint, NEW.document,
            NEW.published_at, NEW.namespace_uid) THEN
            RAISE EXCEPTION 'flowforge_definition is immutable: % v% in namespace % is published and may not be changed (role %)',
                OLD.workflow, OLD.version, OLD.namespace, current_user
                USING ERRCODE = 'insufficient_privilege',
                      HINT = 'publish a new version instead';
        END IF;
        RETURN NEW;
    END IF;
    IF NOT pg_catalog.pg_has_role(current_user, 'flowforge_retention', 'USAGE') THEN
        RAISE EXCEPTION 'flowforge_definition is immutable: % refused for role %', TG_OP,
            current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'only members of flowforge_retention delete published definitions';
    END IF;
    IF TG_LEVEL = 'ROW' THEN
        RETURN OLD;
    END IF;
    RETURN NULL;
END;
$$;

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
