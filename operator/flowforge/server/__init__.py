"""``flowforge server``: the read API over the store and the web UI, as Kubernetes lets each
caller see them (see ``docs/api.md``).

Layers inside: ``main`` <- ``app`` <- (``routes``, ``stream``, ``static``) <- ``reads`` <-
``state`` <- (``access``, ``views``) <- (``models``, ``errors``). It reads through
``flowforge.store`` (as the ``flowforge_server`` role, scoped per transaction) and asks the
apiserver through ``flowforge.kube``; it never imports ``flowforge.operator``.
"""
