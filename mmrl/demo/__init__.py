"""`mmrl demo` (mmrl/cli/demo.py) and `mmrl sweep` (sweep.py): the SFT warm start (starts.py), then GRPO
runs through the REST API (grpo.py), summarised one by one and, for a sweep, as a distribution
(aggregate.py)."""
