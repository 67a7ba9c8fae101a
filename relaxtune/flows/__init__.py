"""Prefect flows for relaxtune (thin wrappers over the library)."""
