"""rollout-bench: trace-replay fault injection for the rollout code of LLM RL stacks."""

__version__ = "0.1.0"
