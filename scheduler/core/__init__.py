"""The rules of the scheduler, pure: no I/O, no clock reads, time passed in.

Everything a node decides that can be decided without the network lives here, so it can
be unit- and property-tested on its own: the task state machine (:mod:`.states`) and the
rows it moves (:mod:`.models`); the timers, intents and settlements of the hot path
(:mod:`.runs`); listing filters and page cursors (:mod:`.listing`); task ids, the API
key format and shards (:mod:`.ids`, :mod:`.api_keys`, :mod:`.sharding`);
which node should own which shard (:mod:`.rendezvous`) and how a planned move proceeds
(:mod:`.handoff`); when a task is due (:mod:`.jitter`) and what a failure leads to
(:mod:`.retry`, :mod:`.backoff`); the hierarchical timing wheel (:mod:`.timing_wheel`)
and the fairness selector that fills worker slots (:mod:`.fairness`); how a dispatch
round spends credits and what it does with its choices (:mod:`.rounds`); what the
reconciler does with in-flight work it finds (:mod:`.repairs`); when a recurring
schedule fires across zones and daylight saving (:mod:`.recurrence`) and what its
materialiser decides at an instant (:mod:`.schedules`); the rules of a workflow DAG:
validation, unlock, upstream failure, run state, retry (:mod:`.workflows`, not wired to
the API yet). The other rooms
call these with what they read and do what they answer.
"""
