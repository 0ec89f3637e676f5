"""Models for machines that cannot download weights: `mmrl init-model tiny` (tiny.py) and a small real
LoRA adapter for it (tiny_adapter.py, for rollout tests and benches). Nothing in the services depends
on them."""
