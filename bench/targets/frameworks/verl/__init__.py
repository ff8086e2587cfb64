"""verl (PyPI `verl`): the agent-loop rollout and replay buffer of its sync trainer, driven in verl's environment."""
