"""What the name-server node (``namesrv``) and the liveness monitor (``streaming``) both use.

The option machinery, the Kafka and Redis clients, the Redis key layout, the metrics endpoint and
its histograms, structured logs and the retry loop. Nothing here imports either package: the node
never imports the monitor, and both stand on this.
"""
