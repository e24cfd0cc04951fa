-- FlowForge schema 14: a published definition is immutable in the database itself.
-- Publishing (store/definitions.py) only INSERTs, by content; nothing in FlowForge updates
-- or deletes a definition row, yet the operator's role holds UPDATE on every engine table
-- (migration 4), so a stolen operator DSN could rewrite what a version runs. A row trigger
-- refuses any UPDATE that changes a published row (its content, identity, publication time,
-- and any column a later migration adds: nothing of a published definition ever changes),
-- to every role, the owner and superusers included (only disabling the trigger, which needs
-- the owner, gets past it; a later migration that must backfill a column does so); an
-- UPDATE that changes nothing passes. DELETE and TRUNCATE are refused to every role
-- without the privileges of flowforge_retention (none deletes definitions today; privileges
-- already refuse the operator and the webhook, the trigger stops the owner and a mistaken
-- grant too), as for flowforge_event (migration 4).
-- Numbered 14 (not 13) so that a parallel branch's 13 does not collide (migrate.py allows gaps).
CREATE FUNCTION flowforge_definition_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF pg_catalog.to_jsonb(OLD) IS DISTINCT FROM pg_catalog.to_jsonb(NEW) THEN
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
ALTER FUNCTION flowforge_definition_immutable() OWNER TO flowforge_migrator;
DO $search_path$
BEGIN
    EXECUTE format('ALTER FUNCTION flowforge_definition_immutable() SET search_path = %I, pg_temp',
                   current_schema());
END
$search_path$;

CREATE TRIGGER flowforge_definition_no_update BEFORE UPDATE ON flowforge_definition
    FOR EACH ROW EXECUTE FUNCTION flowforge_definition_immutable();
CREATE TRIGGER flowforge_definition_no_delete BEFORE DELETE ON flowforge_definition
    FOR EACH ROW EXECUTE FUNCTION flowforge_definition_immutable();
CREATE TRIGGER flowforge_definition_no_truncate BEFORE TRUNCATE ON flowforge_definition
    FOR EACH STATEMENT EXECUTE FUNCTION flowforge_definition_immutable();
