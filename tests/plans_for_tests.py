"""Plan files tests write to disk: one fault on one known trajectory, so the outcome is certain."""

# raise_after_generate on g00001-2's first turn: ref-gather:unfixed loses its batch, :fixed keeps a placeholder
POISON_PLAN = """
name = "poison"
seed = 5

[[rules]]
name = "poison-one"
fault = "raise_after_generate"
trajectories = "g00001-2"
turns = "0"
"""
