-- The server's login (FLOWFORGE_LOGIN) may read every namespace; each request scopes it to
-- the namespaces its caller may read (flowforge.store.roles). Needs the schema (migration 4).
\getenv login FLOWFORGE_LOGIN
INSERT INTO flowforge_reporting_grant (grantee, namespace) VALUES (:'login', '*')
    ON CONFLICT DO NOTHING;
