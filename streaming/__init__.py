"""The streaming liveness monitor: a Spark Structured Streaming job that decides, for every
name-server node at once, when a broker is dead, and keeps topic routes and cluster health
in Redis and Kafka.  ``python -m streaming`` runs it; :mod:`streaming.job` reads top to bottom.
"""
