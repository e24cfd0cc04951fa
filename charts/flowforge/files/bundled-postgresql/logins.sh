#!/bin/sh
# The bundled PostgreSQL's logins (issue 24), applied on every start of its pod: each FlowForge
# component gets a login of its own, a member of its group role and nothing more, with the
# password of its Secret (mounted in /etc/flowforge/logins/<component>/). The pod is Ready
# only once they exist. When the schema is in (the operator's init container migrates as the
# database's owner), the server's login is granted every namespace: each request narrows it.
# Environment: PGHOST, PGUSER, PGPASSWORD, PGDATABASE (the owner), FLOWFORGE_COMPONENTS
# ("component:group ..."), FLOWFORGE_READY (the file the readiness probe looks for).
set -eu
here=$(dirname "$0")
rm -f "$FLOWFORGE_READY"
until pg_isready -q; do sleep 1; done
for pair in $FLOWFORGE_COMPONENTS; do
    component=${pair%%:*}
    secret=/etc/flowforge/logins/$component
    FLOWFORGE_LOGIN=$(cat "$secret/login") FLOWFORGE_PASSWORD=$(cat "$secret/password") \
        FLOWFORGE_GROUP=${pair#*:} psql -X -q -v ON_ERROR_STOP=1 -f "$here/login.sql"
    echo "login $(cat "$secret/login") of the $component: a member of ${pair#*:}"
done
touch "$FLOWFORGE_READY"
until [ "$(psql -X -tAq -c "SELECT to_regclass('flowforge_reporting_grant') IS NOT NULL")" = t ]; do
    sleep 5
done
FLOWFORGE_LOGIN=$(cat /etc/flowforge/logins/server/login) psql -X -q -v ON_ERROR_STOP=1 -f "$here/grant.sql"
echo "the server's login may read every namespace, narrowed per request"
trap 'exit 0' TERM INT
while :; do
    sleep 3600 &
    wait $!
done
