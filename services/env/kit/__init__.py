"""The env kit: what every environment of the env service is built from.

batched.py the `Environment` protocol the servicer serves and `BatchedEnv` (episode table, batch
validation before any change, idle expiry); spec.py episode specs and option checks; seeds.py the
seed ranges and the eval-reserved share of tasks that keep training away from eval sets; evalset.py
fixed, versioned eval sets with a recorded content hash; grid.py cells and the four moves;
actions.py the tolerant parser of move words. An environment (services/env/maze, services/env/sokoban)
is a package built on these, registered by name in services/env/registry.py.
"""
