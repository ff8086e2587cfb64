"""prime-rl (source only): its orchestrator's real `Scheduler.generate_batch` over a real verifiers env server,
whose rollouts call the bench's OpenAI-compatible server."""
