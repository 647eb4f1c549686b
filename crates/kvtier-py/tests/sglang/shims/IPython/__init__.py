"""A stand-in for IPython, which `sglang.utils` imports at module level for notebook
display helpers the storage backend never calls (IPython and its dependencies are not
installed for the tests)."""
