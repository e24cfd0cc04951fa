-- FlowForge schema 12: WorkflowSchedules fire each nominal time exactly once.
-- serves: store/schedules.py
--
-- One row per schedule (its namespace and name; the uid of the object it was made for, a
-- new object of the same name starts afresh): the newest nominal time a pass processed
-- (the watermark), the time waiting under Queue/Replace, the backfills processed, and the
-- missed times counted by reason. One row per fired nominal time, unique per (schedule,
-- nominal time) and per run name, written under the schedule's row lock in the
-- transaction that decides the fire: a second operator, a restart at the fire instant, a
-- resumed schedule or a backfill can never fire a time twice. ``run_uid`` is the
-- WorkflowRun object's, once created; ``settled`` marks a fire whose run is final, so the
-- active runs are found among the unsettled rows only.
CREATE TABLE flowforge_schedule (
    namespace      text NOT NULL,
    name           text NOT NULL,
    uid            text NOT NULL,
    watermark      timestamptz NOT NULL,
    queued_time    timestamptz,
    backfills_done text[] NOT NULL DEFAULT '{}',
    missed         jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, name)
);

CREATE TABLE flowforge_schedule_fire (
    id            bigserial PRIMARY KEY,
    namespace     text NOT NULL,
    schedule_name text NOT NULL,
    schedule_uid  text NOT NULL,
    nominal_time  timestamptz NOT NULL,
    run_name      text NOT NULL,
    backfill_id   text,
    manual        boolean NOT NULL DEFAULT false,
    fired_at      timestamptz NOT NULL DEFAULT now(),
    run_uid       text,
    settled       boolean NOT NULL DEFAULT false,
    CONSTRAINT flowforge_schedule_fire_once UNIQUE (namespace, schedule_name, nominal_time),
    CONSTRAINT flowforge_schedule_fire_run UNIQUE (namespace, run_name),
    CONSTRAINT flowforge_schedule_fire_schedule FOREIGN KEY (namespace, schedule_name)
        REFERENCES flowforge_schedule (namespace, name)
);
CREATE INDEX flowforge_schedule_fire_unsettled_idx
    ON flowforge_schedule_fire (namespace, schedule_name) WHERE NOT settled;

-- the operator writes both (default privileges give it SELECT, INSERT, UPDATE), the
-- webhook reads; reporting logins read the namespaces they are granted
GRANT SELECT ON flowforge_schedule, flowforge_schedule_fire TO flowforge_reporting;
ALTER TABLE flowforge_schedule ENABLE ROW LEVEL SECURITY;
ALTER TABLE flowforge_schedule_fire ENABLE ROW LEVEL SECURITY;
CREATE POLICY flowforge_schedule_engine ON flowforge_schedule
    TO flowforge_operator, flowforge_retention USING (true) WITH CHECK (true);
CREATE POLICY flowforge_schedule_webhook ON flowforge_schedule FOR SELECT
    TO flowforge_webhook USING (true);
CREATE POLICY flowforge_schedule_reporting ON flowforge_schedule FOR SELECT
    TO flowforge_reporting USING (
        namespace = ANY ((SELECT flowforge_readable_namespaces())::text[])
        OR '*' = ANY ((SELECT flowforge_readable_namespaces())::text[]));
CREATE POLICY flowforge_schedule_fire_engine ON flowforge_schedule_fire
    TO flowforge_operator, flowforge_retention USING (true) WITH CHECK (true);
CREATE POLICY flowforge_schedule_fire_webhook ON flowforge_schedule_fire FOR SELECT
    TO flowforge_webhook USING (true);
CREATE POLICY flowforge_schedule_fire_reporting ON flowforge_schedule_fire FOR SELECT
    TO flowforge_reporting USING (
        namespace = ANY ((SELECT flowforge_readable_namespaces())::text[])
        OR '*' = ANY ((SELECT flowforge_readable_namespaces())::text[]));
