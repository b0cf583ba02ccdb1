"""Decoders: raw Kafka records -> changelog rows. One module per format."""
