"""The algorithm: one GRPO run read top to bottom (runloop.py) and the pure pieces it calls.

tasks.py the step's task seed and the checks of a config against the env; episodes.py playing groups of
episodes turn by turn; sampling.py which groups a step trains on (plain, or DAPO's dynamic sampling);
credit.py per-turn advantages by variant (grpo, gigpo) over advantages.py's maths; trajectories.py
episodes into the learner's token arrays; evaluation.py the fixed eval set; records.py what a step and
an eval record.
"""
