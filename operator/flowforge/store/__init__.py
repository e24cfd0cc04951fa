"""The PostgreSQL store: FlowForge's system of record (psycopg 3, async, ``psycopg_pool``).

Tables (``migrations/0001_initial.sql``)
----------------------------------------
- ``flowforge_lease``: one row per lease (``operator``): holder, ``epoch``, expiry.
- ``flowforge_definition``: published definitions, one per (namespace, workflow, version),
  the validated ``spec`` document and its fingerprint. Written once, never updated.
- ``flowforge_run``: one per ``WorkflowRun`` object (namespace, name, uid), its phase,
  ``compensating`` (rolling back), ``cancel_requested``, ``finished_at`` (set exactly when
  the phase is terminal), and after retention ``pruned_at`` with ``final_counts``.
- ``flowforge_task``: one row per forward task and per compensator of a run; ``state``,
  ``attempt``/``max_attempts``, ``pending_dependencies`` (upstreams not yet succeeded),
  ``not_before`` (retry backoff), ``topological_index`` (rollback order).
- ``flowforge_task_dependency``: the run's edges (upstream task row -> dependent task row).
- ``flowforge_event``: the append-only history (triggers refuse UPDATE, and DELETE and
  TRUNCATE to all but retention).
- ``flowforge_schema_migration``: applied migration versions (``migrate.py``).
- ``flowforge_reporting_grant``: which namespaces each reporting login may read (schema 4).
- ``flowforge_namespace_limits``: a namespace's ``maxRunningRuns``, ``maxRunningTasks`` and
  ``caps.maxParallelTasks``, copied from its FlowForgePolicy objects (schema 5, ``queue.py``);
  runs carry their own ``priority``, ``submitted_at``, ``max_parallel_tasks``, concurrency
  key, ``max_runs``, policy and, while queued, ``queue_reason``.

Roles (``migrations/0004_roles.sql``, ``roles.py`` with the threat model): migrator (owns
everything), operator (no DELETE/TRUNCATE), webhook (read-only), retention (the only one
that deletes history), reporting and server (row-level security by namespace).

States (``flowforge.domain.states``, mirrored by CHECK constraints)
-------------------------------------------------------------------
Runs: Pending, Queued, Running, Succeeded, Failed, Cancelled (+ the ``compensating`` flag while a
rollback runs; the run finishes only when it settles). Forward tasks: waiting, ready,
running, succeeded, failed, skipped, cancelled. Compensators: not_triggered, pending,
running, succeeded, failed, skipped. One CHECK ties the allowed states to the row's role,
others: finished_at iff terminal, compensating only while running, attempt <= max_attempts,
a released task has no pending dependencies. A unique partial index allows at most one
running compensator per run.

The fencing rule
----------------
Every write takes a ``Fence`` (lease name and epoch, from ``lease.acquire_lease``). Its
transaction starts by locking the lease row ``FOR KEY SHARE`` and comparing epochs; a stale
epoch raises ``StaleEpochError`` and the transaction rolls back, changing nothing. A new
holder increments the epoch (a key column) with an UPDATE of that row, which waits for
in-flight writes of the old epoch, so no old-epoch write can commit after a takeover; a
renewal (``expires_at`` only) waits for none of them. On top of the fence,
every move is a compare-and-set on the expected state and attempt; a move that loses
returns ``Decision.lost()`` (``flowforge.domain.decision``), never an exception. Every
decision runs through ``transaction.in_transaction``, which re-runs it after a
serialization failure or deadlock.

The moves, one module each
--------------------------
``runs.create_run`` (the whole graph at once; reuse for a retry, ``reuse.py``; a duplicate
of an earlier run's ``spec.idempotencyKey`` gets none, ``duplicates.py``),
``dispatch.dispatch_due``, ``outcomes.record_outcome`` (success, failure with retry, skip
downstream, a compensator's outcome), ``cancel.cancel_run``, ``moves.settle_run`` (finish,
start the rollback or its next compensator). Every one returns a ``Decision``; the
operator's applier acts on it after the commit. Every move but the success hot path runs in
the one lock order through ``moves.locked_move`` (fence, namespace lock, the move's run and
task rows, then settle and fill). Reads are in ``queries.py``. Every move that starts
attempts returns them in one row shape (``attempts.py``), from which ``Dispatch.of`` builds
the instruction to create each Job.

Queries and the index that serves each
--------------------------------------
======================================  ==================================================
query (function)                        index
======================================  ==================================================
publish / load / list / newest version  ``flowforge_definition_identity`` (unique)
create_run idempotency, find_run        ``flowforge_run_identity`` (unique)
sweep_page (reconciler: active runs)    ``flowforge_run_active_idx`` (partial)
listed_runs (reconciler: listed objs)   ``flowforge_run_identity`` (unique)
a Job's run by uid, any namespace       ``flowforge_run_uid_idx`` (schema 7)
prune: finished runs before cutoff      ``flowforge_run_prunable_idx`` (partial)
run_progress (GROUP BY role, state)     ``flowforge_task_progress_idx`` (index-only)
settle probe "any unresolved task?"     ``flowforge_task_progress_idx``
every move on (run, task key)           ``flowforge_task_identity`` (unique)
active_tasks, sweep_page's rows         ``flowforge_task_progress_idx``
release dependents, transitive skip     ``flowforge_task_dependency`` primary key
FK check on task delete (retention)     ``flowforge_task_dependency_task_idx``
prune a run's edges                     ``flowforge_task_dependency_run_idx``
run_history, prune a run's events       ``flowforge_event_run_idx``
======================================  ==================================================
``tests/store/test_indexes.py`` asserts each plan with EXPLAIN after ANALYZE.

Transactions: decide in a transaction, commit, then act on Kubernetes idempotently; never
call Kubernetes inside one. Recording a success is the hot path and is one statement
(``outcomes.RECORD_SUCCESS_QUERY``: fence check, compare-and-set, release of dependents
under row locks taken in id order, their dispatch to running, events) on an autocommit
connection, so one round trip.
Settling the run happens right after the outcome commits (``settle.py`` explains why that
is exactly once) and again from the reconciler as a backstop. Pool connections are in
autocommit mode; ``transaction.in_transaction`` opens transactions explicitly.
"""

from flowforge.store.connection import Connection, Pool
from flowforge.store.lease import Fence, Lease
from flowforge.store.pool import open_pool

__all__ = ["Connection", "Fence", "Lease", "Pool", "open_pool"]
