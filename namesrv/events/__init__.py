"""Events out and actions in: how a node talks to the streaming liveness monitor through Kafka.

* :mod:`namesrv.events.schema`: the versioned JSON of events and actions (shared with the Spark
  job; no Kafka or Spark imports);
* :mod:`namesrv.events.publisher`: the node's observer, publishing events from a bounded queue;
* :mod:`namesrv.events.actions`: the action consumer and the fenced applier;
* :mod:`namesrv.events.link`: :class:`~namesrv.events.link.KafkaLink`, which puts them together
  for :mod:`namesrv.app`.

This package module imports nothing: the Spark job's Python workers import the schema alone,
and every worker that starts would otherwise pay for the node's request handlers too. A node
without ``kafkaBootstrapServers`` never imports the link (nor kafka-python).
"""
