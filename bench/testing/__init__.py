"""Testing tools: the pytest plugin, Hypothesis strategies and profiles, fault-plan exploration."""
