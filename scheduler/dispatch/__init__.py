"""The hot path: a due task goes from PostgreSQL to a worker slot.

:mod:`.preloader` moves tasks due within the lookahead of the owned shards into memory;
:mod:`.dispatcher` fires them from the timing wheel into the ready queues, writes the
round's intents (DISPATCHED, token + 1) in one transaction and only then sends the
assignments (the round's policy is :mod:`chronoshard.scheduler.core.rounds`). Acks,
heartbeats, settlements and single submits are written through batches of
:mod:`.group_commit`, the node's one group commit. :mod:`.faults` names the crash points
the fault tests arm between these steps.
"""
