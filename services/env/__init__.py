"""The environment service: the maze, and Sokoban with `--env sokoban` (no torch, no vLLM, no grpc
outside `servicer.py`/`main.py`/`bench.py`).

batched.py the `Environment` protocol and the batched episode bookkeeping every environment shares;
actions.py action parser, render.py frames, spec.py option validation, episode.py one episode,
store.py live episodes, environment.py the maze's batched in-process EnvService (`MazeEnv`),
evalset.py eval sets, servicer.py gRPC, main.py `mmrl serve env`, bench.py `mmrl bench env`.
sokoban/ the Sokoban environment (`SokobanEnv`, docs/sokoban.md). The maze itself (generation, BFS
solver, seed ranges) is shared code: services/env/maze/maze.py. See docs/env.md.
"""
