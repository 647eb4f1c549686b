"""Shared by the Python tests: this folder on sys.path (for `serve`)."""
