"""Running the bench: one run end to end, its repro, known findings, watchdog and progress."""
