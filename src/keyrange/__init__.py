"""keyrange: keyed, ordered, deduplicated Kafka stream consumers that rescale by hash range."""

__version__ = "0.1.0"
