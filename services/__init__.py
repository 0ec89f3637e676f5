"""MMRL services: env, rollout, learner, coordinator, and the code they share (`services.common`)."""
