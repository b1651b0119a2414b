"""A wire-compatible Apache RocketMQ NameServer."""
