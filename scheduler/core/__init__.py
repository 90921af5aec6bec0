"""The rules of the scheduler, pure: no I/O, no clock reads, time passed in.

Everything a node decides that can be decided without the network lives here, so it can
be unit- and property-tested on its own: the task state machine (:mod:`.states`) and the
rows it moves (:mod:`.models`); task ids and shards (:mod:`.ids`, :mod:`.sharding`);
which node should own which shard (:mod:`.rendezvous`) and how a planned move proceeds
(:mod:`.handoff`); when a task is due (:mod:`.jitter`) and what a failure leads to
(:mod:`.retry`, :mod:`.backoff`); the hierarchical timing wheel (:mod:`.timing_wheel`)
and the fairness selector that fills worker slots (:mod:`.fairness`). The other rooms
call these with what they read and do what they answer.
"""
