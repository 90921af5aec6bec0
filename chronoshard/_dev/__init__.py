"""Local processes for development and tests: ``chronoshard dev`` and what it starts.

:mod:`.cluster` is the launcher (etcd, PostgreSQL, migrations, tenants, scheduler nodes,
the watchdog, a demo worker, in that order, and the stop in reverse); :mod:`.demo_tasks`
the ``--demo`` run. :mod:`.etcd` and :mod:`.postgres` start a private etcd and an
embedded PostgreSQL (the test suite uses them through :mod:`chronoshard.services`, the
documented import path); :mod:`.processes` holds their shared process plumbing (free
ports, readiness waits), :mod:`.lifeline` the keeper that stops every child if the
launcher dies, and :mod:`.quiet_stream` the stdout that survives a closed pipe.
"""
