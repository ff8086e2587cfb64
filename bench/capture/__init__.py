"""Live traffic: read it (`parse`), place it in trajectories (`tracker`), record it as a trace (`recording`)."""
