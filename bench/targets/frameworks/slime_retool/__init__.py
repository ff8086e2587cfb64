"""slime's retool example (THUDM/slime `examples/retool`): its multi-turn code-interpreter generate, run from a
slime checkout in the slime environment."""
