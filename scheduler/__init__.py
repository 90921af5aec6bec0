"""The scheduler daemon: API, shard ownership, preloader, timing wheel, dispatcher,
worker gateway, reconciler and store. Pure cores (states, timing wheel, jitter, sharding)
take time as an argument; I/O lives in the store, coordination and gRPC modules."""
