"""What the name-server node (``namesrv``) and the liveness monitor (``streaming``) both use.

RocketMQ's remoting protocol (:mod:`common.protocol`) and the route tables that the node serves and
the monitor runs for its route model in Redis (:mod:`common.routes`); the option machinery, the Kafka
and Redis clients, the Redis key layout, the metrics endpoint and its histograms, structured logs, the
retry loop, ``/proc`` (:mod:`common.procfs`) and the command lines' text (:mod:`common.cli_text`). Nothing here imports either package: the node never imports
the monitor, and both stand on this. Below the rest, importing none of it, is the contract the node
and the monitor exchange through Kafka (:mod:`common.contract`).
"""
