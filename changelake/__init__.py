"""changelake: Kafka-to-lakehouse change data capture on Spark and Delta Lake."""

__version__ = "0.1.0"
