"""The Spark standalone cluster of :mod:`infra.spark_cluster`, for tests (re-exported as it is)."""

from infra.spark_cluster import SparkCluster, SparkDaemon, spark_class, spark_cluster, spark_home

__all__ = ["SparkCluster", "SparkDaemon", "spark_class", "spark_cluster", "spark_home"]
