"""The ``chronoshard`` command's subcommands, by what they talk to.

:mod:`.tasks` speaks TaskService (submit, inspect, list, cancel, retry, resolve);
:mod:`.admin` AdminService, the nodes' ``/metrics`` and WatchdogService (status, drain,
expectations); :mod:`.ops` the database and local processes directly (migrations,
tenants, partitions, the dev cluster); :mod:`.common` holds the command table's types and
the argument parsers they share, :mod:`.output` the tables and JSON they print. The table
itself and ``main`` are :mod:`chronoshard.cli`.
"""
