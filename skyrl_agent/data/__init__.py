"""Stored runs: the trajectory schema, the append-only Parquet store and the run folder."""
