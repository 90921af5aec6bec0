"""A node among nodes: who owns what, whose clock counts, what nobody is watching.

:mod:`.coordination` is the one module that talks to etcd (the node lease, membership,
shard claims, handoff marks); :mod:`.shards` turns the membership into owned shards
under epochs, with warm handoff on a planned move and self-fencing when the lease may
have lapsed; :mod:`.clock` measures this node's offset to PostgreSQL's clock and stops
dispatch when it is out of bound; :mod:`.routing` decides which node must act on a
changed task and :mod:`.signals` carries "due soon" and "ready" to it over
LISTEN/NOTIFY; :mod:`.liveness` records which workers have a session where;
:mod:`.reconciler` repairs in-flight work a crash or a lost worker left behind;
:mod:`.maintenance` creates and drops day partitions.
"""
