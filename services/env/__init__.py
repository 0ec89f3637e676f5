"""The maze environment service (no torch, no vLLM, no grpc outside `servicer.py`/`main.py`/`bench.py`).

actions.py action parser, render.py frames, spec.py option validation, episode.py one episode,
store.py live episodes, environment.py the batched in-process EnvService, evalset.py eval sets,
servicer.py gRPC, main.py `mmrl serve env`, bench.py `mmrl bench env`. The maze itself (generation,
BFS solver, seed ranges) is shared code: services/common/maze.py. See docs/env.md.
"""
