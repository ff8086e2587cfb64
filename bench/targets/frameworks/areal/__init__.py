"""AReaL (PyPI `areal`): its remote SGLang engine and workflows, run against the bench server."""
