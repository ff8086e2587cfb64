"""miles (miles-rl), a slime fork: its adapter, environment and known findings."""
