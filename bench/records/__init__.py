"""What a run records, shared by the server, the targets, the invariants and the report."""
