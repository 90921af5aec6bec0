"""The hot path: a due task goes from PostgreSQL to a worker slot, and its outcome back.

:mod:`.preloader` moves tasks due within the lookahead of the owned shards into memory;
:mod:`.dispatcher` fires them from the timing wheel into the ready queues, writes the
round's intents (DISPATCHED, token + 1) in one transaction and only then sends the
assignments (the round's policy is :mod:`chronoshard.scheduler.core.rounds`) through
:mod:`.sessions`, the node's worker sessions (each stream's credits, bounded outbox and
the tasks it holds). Acks, heartbeats and settlements come back through
:mod:`.settlements`, one :mod:`.group_commit` committer per kind, whose flushes tell the
dispatcher what they freed; single submits use the same committer. The
``WorkerService`` servicer in front of both is :mod:`chronoshard.scheduler.api.workers`.
:mod:`.dispatcher` also reports each worker's backlog here as it changes, and reads
each tenant's fairness limits from :mod:`.tenant_limits`. :mod:`.faults` names the
crash points the fault tests arm between these steps.
"""
