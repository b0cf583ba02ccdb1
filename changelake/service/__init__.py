"""The service: configuration, CLI, pipeline assembly, metrics, health, demo."""
