-- FlowForge schema 4: database roles, append-only history, row-level security for reporting.
-- The design and its threat model are in flowforge.store.roles (the names below are its
-- constants; tests/store/test_roles.py holds both in sync). Group roles are NOLOGIN and
-- cluster-global: a deployer grants them to login roles, e.g.
--     CREATE ROLE flowforge_operator_login LOGIN PASSWORD '...' IN ROLE flowforge_operator;
-- Applying this file the first time needs a login that may create roles (CREATEROLE) unless
-- an administrator created the group roles before (then also GRANT flowforge_reporting TO
-- flowforge_server, and the migrator group to the migrating login), and that owns the schema (the database
-- owner) or a superuser. Nothing here names objects of migration 3: privileges on tables are
-- granted over every flowforge_ table present, and by default on every later one.

-- 1. The group roles, created once per server (another database may have made them; two
--    migrations racing on one server both succeed).
DO $roles$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY[
        'flowforge_migrator', 'flowforge_operator', 'flowforge_webhook',
        'flowforge_retention', 'flowforge_reporting', 'flowforge_server'
    ] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', role_name);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;
            END;
        END IF;
    END LOOP;
    -- the read API server reads as reporting, narrowed per transaction (see below)
    IF NOT pg_catalog.pg_has_role('flowforge_server', 'flowforge_reporting', 'MEMBER') THEN
        GRANT flowforge_reporting TO flowforge_server;
    END IF;
    -- whoever applies this becomes a migrator, so it may hand the schema to the group role
    IF NOT pg_catalog.pg_has_role(current_user, 'flowforge_migrator', 'MEMBER') THEN
        EXECUTE format('GRANT flowforge_migrator TO %I', current_user);
    END IF;
END
$roles$;

-- 2. The migrator group owns every FlowForge object, so any of its logins can migrate later
--    (store/migrate.py runs later migrations with SET ROLE flowforge_migrator).
DO $ownership$
DECLARE
    object record;
BEGIN
    EXECUTE format('GRANT USAGE, CREATE ON SCHEMA %I TO flowforge_migrator', current_schema());
    FOR object IN
        SELECT c.relname FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema())
          AND c.relkind IN ('r', 'p') AND c.relname LIKE 'flowforge\_%'
    LOOP
        EXECUTE format('ALTER TABLE %I OWNER TO flowforge_migrator', object.relname);
    END LOOP;
    FOR object IN
        SELECT p.oid::regprocedure AS signature FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()) AND p.proname LIKE 'flowforge\_%'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO flowforge_migrator', object.signature);
    END LOOP;
END
$ownership$;

-- 3. Table privileges. Nobody but the owner gets anything by default.
DO $privileges$
DECLARE
    object record;
BEGIN
    FOR object IN
        SELECT c.relname FROM pg_catalog.pg_class AS c
        WHERE c.relnamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema())
          AND c.relkind IN ('r', 'p') AND c.relname LIKE 'flowforge\_%'
          AND c.relname <> 'flowforge_schema_migration'
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE %I FROM PUBLIC', object.relname);
        -- the operator: every move of the engine; it never deletes and never truncates
        EXECUTE format('GRANT SELECT, INSERT, UPDATE ON TABLE %I TO flowforge_operator',
                       object.relname);
        -- admission reads (definitions, and whatever a later check needs), never writes
        EXECUTE format('GRANT SELECT ON TABLE %I TO flowforge_webhook', object.relname);
    END LOOP;
    EXECUTE format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO flowforge_operator',
                   current_schema());
    -- tables created by later migrations (as flowforge_migrator) get the same
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE flowforge_migrator IN SCHEMA %I '
                   'GRANT SELECT, INSERT, UPDATE ON TABLES TO flowforge_operator',
                   current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE flowforge_migrator IN SCHEMA %I '
                   'GRANT USAGE ON SEQUENCES TO flowforge_operator', current_schema());
    EXECUTE format('ALTER DEFAULT PRIVILEGES FOR ROLE flowforge_migrator IN SCHEMA %I '
                   'GRANT SELECT ON TABLES TO flowforge_webhook', current_schema());
END
$privileges$;

-- retention: finds old finished runs, stamps them pruned, deletes their rows and history
GRANT SELECT, UPDATE ON flowforge_run TO flowforge_retention;
GRANT SELECT, DELETE ON flowforge_task, flowforge_task_dependency, flowforge_event
    TO flowforge_retention;
-- every role checks the schema version when it connects
GRANT SELECT ON flowforge_schema_migration
    TO flowforge_operator, flowforge_webhook, flowforge_retention, flowforge_reporting;
-- reporting reads what it is granted, row by row (the policies below)
GRANT SELECT ON flowforge_definition, flowforge_run, flowforge_task,
    flowforge_task_dependency, flowforge_event TO flowforge_reporting;

-- 4. History refuses DELETE and TRUNCATE except by retention. Privileges already stop every
--    role but retention and the owner; the trigger stops the owner too (and any role a
--    deployer granted DELETE by mistake).
CREATE FUNCTION flowforge_event_deleted_only_by_retention() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_catalog.pg_has_role(current_user, 'flowforge_retention', 'USAGE') THEN
        RAISE EXCEPTION 'flowforge_event is append-only: % refused for role %', TG_OP,
            current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'only members of flowforge_retention (flowforge db prune) delete history';
    END IF;
    RETURN NULL;
END;
$$;
ALTER FUNCTION flowforge_event_deleted_only_by_retention() OWNER TO flowforge_migrator;
CREATE TRIGGER flowforge_event_no_delete BEFORE DELETE ON flowforge_event
    FOR EACH STATEMENT EXECUTE FUNCTION flowforge_event_deleted_only_by_retention();
CREATE TRIGGER flowforge_event_no_truncate BEFORE TRUNCATE ON flowforge_event
    FOR EACH STATEMENT EXECUTE FUNCTION flowforge_event_deleted_only_by_retention();

-- 5. Reporting: which namespaces each reporting login may read. Written only by the owner
--    (an administrator as migrator); a reporting login sees its own rows.
CREATE TABLE flowforge_reporting_grant (
    grantee    name NOT NULL,
    -- a Kubernetes namespace (a DNS label), or '*' for every namespace
    namespace  text NOT NULL
        CHECK (namespace = '*' OR namespace ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grantee, namespace)
);
ALTER TABLE flowforge_reporting_grant OWNER TO flowforge_migrator;
REVOKE ALL ON flowforge_reporting_grant FROM PUBLIC, flowforge_operator, flowforge_webhook;
GRANT SELECT ON flowforge_reporting_grant TO flowforge_reporting;
ALTER TABLE flowforge_reporting_grant ENABLE ROW LEVEL SECURITY;
CREATE POLICY flowforge_reporting_grant_own ON flowforge_reporting_grant FOR SELECT
    TO flowforge_reporting USING (grantee = current_user);

-- The scope a server narrows one transaction to: "<transaction start>|ns1,ns2". Bound to
-- the transaction that set it, so a scope left on a pooled connection reads nothing.
CREATE FUNCTION flowforge_scope_namespaces(namespaces text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM unnest(namespaces) AS n
               WHERE n IS NULL OR n !~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$') THEN
        RAISE EXCEPTION 'not a namespace name in %', namespaces
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pg_catalog.set_config('flowforge.namespaces',
        extract(epoch FROM pg_catalog.transaction_timestamp())::text || '|' || array_to_string(namespaces, ','),
        true);
END;
$$;
ALTER FUNCTION flowforge_scope_namespaces(text[]) OWNER TO flowforge_migrator;

-- May the current role read rows of this namespace? Its grants, and for a server (a member
-- of flowforge_server) also the scope of the current transaction. Not SECURITY DEFINER: it
-- runs as the reader, whose own grant rows the policy on flowforge_reporting_grant shows.
CREATE FUNCTION flowforge_may_read_namespace(target text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT FROM flowforge_reporting_grant AS g
        WHERE g.grantee = current_user AND g.namespace IN (target, '*')
    ) AND (
        NOT pg_catalog.pg_has_role(current_user, 'flowforge_server', 'USAGE')
        OR coalesce(
            split_part(pg_catalog.current_setting('flowforge.namespaces', true), '|', 1)
                = extract(epoch FROM pg_catalog.transaction_timestamp())::text
            AND target = ANY (string_to_array(split_part(
                pg_catalog.current_setting('flowforge.namespaces', true), '|', 2), ',')),
            false)
    )
$$;
ALTER FUNCTION flowforge_may_read_namespace(text) OWNER TO flowforge_migrator;
-- resolve names in this schema only: a reader's temporary table named like the grants must
-- not stand in for them (pg_temp is otherwise searched first)
DO $search_path$
BEGIN
    EXECUTE format('ALTER FUNCTION flowforge_may_read_namespace(text) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION flowforge_scope_namespaces(text[]) SET search_path = %I, pg_temp',
                   current_schema());
END
$search_path$;
REVOKE ALL ON FUNCTION flowforge_scope_namespaces(text[]), flowforge_may_read_namespace(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION flowforge_scope_namespaces(text[]), flowforge_may_read_namespace(text)
    TO flowforge_reporting;

-- 6. Row-level security. Every role but reporting sees every row (its privileges above
--    decide what it may do); reporting sees the namespaces it may read. The owner (the
--    migrator) and superusers bypass row-level security, as PostgreSQL always lets them.
DO $policies$
DECLARE
    table_name text;
BEGIN
    FOREACH table_name IN ARRAY ARRAY[
        'flowforge_definition', 'flowforge_run', 'flowforge_task',
        'flowforge_task_dependency', 'flowforge_event'
    ] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', table_name);
        EXECUTE format('CREATE POLICY %I ON %I TO flowforge_operator, flowforge_retention '
                       'USING (true) WITH CHECK (true)', table_name || '_engine', table_name);
        EXECUTE format('CREATE POLICY %I ON %I FOR SELECT TO flowforge_webhook USING (true)',
                       table_name || '_webhook', table_name);
    END LOOP;
END
$policies$;

CREATE POLICY flowforge_definition_reporting ON flowforge_definition FOR SELECT
    TO flowforge_reporting USING (flowforge_may_read_namespace(namespace));
CREATE POLICY flowforge_run_reporting ON flowforge_run FOR SELECT
    TO flowforge_reporting USING (flowforge_may_read_namespace(namespace));
-- rows of a run: visible when the run is (the subquery is itself under the run's policy)
CREATE POLICY flowforge_task_reporting ON flowforge_task FOR SELECT
    TO flowforge_reporting USING (EXISTS (SELECT FROM flowforge_run AS r WHERE r.id = run_id));
CREATE POLICY flowforge_task_dependency_reporting ON flowforge_task_dependency FOR SELECT
    TO flowforge_reporting USING (EXISTS (SELECT FROM flowforge_run AS r WHERE r.id = run_id));
CREATE POLICY flowforge_event_reporting ON flowforge_event FOR SELECT
    TO flowforge_reporting USING (EXISTS (SELECT FROM flowforge_run AS r WHERE r.id = run_id));
