"""verifiers (prime-rl's environments): its adapter, environment and record conversion."""
