"""The Sokoban environment of the env service (`mmrl serve env --env sokoban`): one box, one target.

level.py levels from a seed by reverse play, solver.py the BFS oracle, render.py frames, episode.py
one episode, env.py the batched in-process `SokobanEnv`, evalset.py its eval sets. See docs/sokoban.md.
"""
