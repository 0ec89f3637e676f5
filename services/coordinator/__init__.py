"""The coordinator: REST API for runs, the multi-turn GRPO run loop, run state in Redis."""
