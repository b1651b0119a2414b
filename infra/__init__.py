"""The local system's processes, for development, tests and ``make run``; ``infra/deploy/`` deploys for real.

Each module is one room: :mod:`infra.processes` (the base of every service: a tracked child process, its
pidfile, ports, PIDs, binaries), :mod:`infra.config` (``conf/services.properties``), :mod:`infra.kafka`
(Apache Kafka, one KRaft node or a cluster, and topic admin), :mod:`infra.redis` (Redis),
:mod:`infra.apps` (a name-server node, the console, the Spark job), :mod:`infra.supervisor` (restarting
what dies), :mod:`infra.stack` (``python -m infra.stack``: ``make run`` and ``make stop``),
:mod:`infra.services` (``python -m infra.services``: Kafka and Redis by hand), and the replicated
topology's parts: :mod:`infra.topology`, :mod:`infra.redis_cluster`, :mod:`infra.spark_cluster`,
:mod:`infra.rocketmq`.
"""
