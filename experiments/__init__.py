"""Experiment definitions: one ml_collections `get_config()` file per experiment."""
