"""Aggregating processed records with Spark (see docs/aggregation.md)."""
