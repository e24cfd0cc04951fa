-- FlowForge schema 21: a task's forEach (flowforge.domain.for_each). Each item is a task
-- row of its own, keyed `<task>[<item key>]` (its compensator `<compensator>[<item key>]`),
-- with its own attempts and Job; the row records its item (item_key, item: the JSON its
-- container gets as FLOWFORGE_ITEM) and its group, the forEach task's key (item_group, the
-- same on the compensator's rows). Forward rows carry their group's limits, decided when
-- the run is created: at most group_max_parallel of the group run at once (dispatch,
-- store/queue.py), and group_tolerated failed items still let the group succeed; a failed
-- row within that tolerance is marked tolerated (its dependents were released).
ALTER TABLE flowforge_task ADD COLUMN item_group text;
ALTER TABLE flowforge_task ADD COLUMN item_key text;
ALTER TABLE flowforge_task ADD COLUMN item jsonb;
ALTER TABLE flowforge_task ADD COLUMN group_max_parallel integer
    CHECK (group_max_parallel >= 1);
ALTER TABLE flowforge_task ADD COLUMN group_tolerated integer CHECK (group_tolerated >= 0);
ALTER TABLE flowforge_task ADD COLUMN tolerated boolean NOT NULL DEFAULT false;
-- no index of its own: a group's rows are found among the run's running or failed rows
-- (flowforge_task_progress_idx), which its limits keep few
