"""Events out and actions in: how a node talks to the streaming liveness monitor through Kafka.

* :mod:`namesrv.events.publisher`: the node's observer, publishing events from a bounded queue;
* :mod:`namesrv.events.actions`: the action consumer and the fenced applier;
* :mod:`namesrv.events.link`: :class:`~namesrv.events.link.KafkaLink`, which puts them together
  for :mod:`namesrv.app`.

The records themselves, their bounds and their JSON are the contract the node shares with the
monitor, :mod:`common.contract`, a layer below both.  This package module imports nothing, so that
a node without ``kafkaBootstrapServers`` never imports the link (nor kafka-python).
"""
