"""The processes ``python -m bench peers`` runs for each system (issue 14).

Every system runs the same handler: note the wall clock at its start with the task's
key (:mod:`bench._peers.stamps`) and return. ``chronoshard_app`` is a Chronoshard worker,
``celery_app`` a Celery app on Redis, ``procrastinate_app`` a Procrastinate app on
PostgreSQL; the benchmark imports the same modules to submit. Worker processes get the
repository root on ``PYTHONPATH`` and import these as ``bench._peers.*``.
"""
