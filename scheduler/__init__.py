"""The scheduler daemon (``chronoshard-scheduler``): one node of the cluster.

Five rooms, one mechanism each, and the wiring between them:

- :mod:`.core` — the rules, pure: states, ids and shards, jitter and retry policy, the
  timing wheel, fairness, handoff planning. No I/O, no clock reads.
- :mod:`.api` — the gRPC servicers and the wire: what a request may hold, who may make
  it, how every refusal leaves the node.
- :mod:`.dispatch` — the hot path: preload → wheel → ready queues → intent → send.
- :mod:`.cluster` — who owns which shard, which clock counts, what nobody is watching:
  etcd, shard ownership and handoff, signals between nodes, the reconciler, maintenance.
- :mod:`.store` — every statement PostgreSQL sees, the pool, the shard fence, the
  migrations.

:mod:`.node` builds the pieces, supervises them and shuts them down in a numbered order;
:mod:`.config`, :mod:`.errors` and :mod:`.metrics` serve every room.
"""
