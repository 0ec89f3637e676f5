"""Gymnasium environments served over EnvService (`mmrl serve env --gymnasium ID`).

presets.py the named presets (MiniGrid, FrozenLake) and how an env id, its kwargs and its action words
are resolved into a `GymSource`; episode.py one Gymnasium env as an episode (frames, text, rewards,
terminated vs truncated); env.py `GymnasiumEnv`, the batched environment the env service serves.
Gymnasium and MiniGrid are an optional extra (`pip install -e '.[gym]'`): nothing here imports them
until an environment is made.
"""
