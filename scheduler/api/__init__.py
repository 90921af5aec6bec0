"""The gRPC edge of a node: servicers, the wire and its rules.

The node's one gRPC server (:mod:`.server`: options, TLS, health) hosts them all. A
request arrives through one decoding and error boundary (:mod:`.boundary`: bad bytes
are ``INVALID_ARGUMENT``, every failure gets one status and a bounded message), is
authenticated (:mod:`.auth`, :mod:`.access`), converted from ``chronoshard.v1`` messages
to the core's types (:mod:`.convert`), resolved and validated (:mod:`.task_requests`,
:mod:`.payloads`), and served: ``TaskService`` (:mod:`.tasks`), ``WorkerService``
(:mod:`.workers`: the worker's stream, its unary settlements and their parsing; the
sessions and the group commits behind it are :mod:`chronoshard.scheduler.dispatch.sessions`
and :mod:`chronoshard.scheduler.dispatch.settlements`), ``AdminService`` (:mod:`.admin`)
and ``WatchdogService`` (:mod:`.expectations`). With :mod:`chronoshard.scheduler.node` and
the worker sessions, whose outboxes hold protobuf messages on purpose (the hot path's
cost), these are the only server modules that import generated code.
"""
