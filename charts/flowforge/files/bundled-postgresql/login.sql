-- One component's login (psql, as the database's owner): FLOWFORGE_LOGIN, a member of
-- FLOWFORGE_GROUP only, with FLOWFORGE_PASSWORD. Idempotent; a password changed in the
-- Secret is applied on the pod's next start. The group role may not exist yet (migration 4
-- creates it too, and tolerates it made here).
SET client_min_messages = warning;
\getenv login FLOWFORGE_LOGIN
\getenv password FLOWFORGE_PASSWORD
\getenv group FLOWFORGE_GROUP
SET flowforge.login_role = :'login';
SET flowforge.group_role = :'group';
DO $$
BEGIN
    BEGIN
        EXECUTE format('CREATE ROLE %I NOLOGIN', current_setting('flowforge.group_role'));
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
    END;
    BEGIN
        EXECUTE format('CREATE ROLE %I LOGIN', current_setting('flowforge.login_role'));
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
    END;
END
$$;
ALTER ROLE :"login" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    INHERIT PASSWORD :'password';
GRANT :"group" TO :"login";
