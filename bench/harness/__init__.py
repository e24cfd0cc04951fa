"""The one harness every benchmark runs on.

- ``cluster``: a local control plane (kwok) with FlowForge's CRDs, a local PostgreSQL and API
  clients (``start_bench``, or ``bench_environment`` with a fresh namespace), the
  apiserver's own request counters, a baseline checkout to compare against;
- ``watch``: watchers that time Jobs, Pods and runs from raw watch streams, the raw ceilings
  of a plain client, percentiles;
- ``runs``: WorkflowRuns created and waited for, definitions published;
- ``processes``: the real operator as a child process, CPU time from /proc, the profiler.

Everything binds 127.0.0.1; everything started here is stopped on the way out (SIGTERM to a
bench runs the ``finally`` blocks too: ``exit_on_sigterm``).
"""
