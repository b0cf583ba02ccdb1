"""Connectors: the Kafka source (a Spark Python streaming data source) and the Delta sink."""
