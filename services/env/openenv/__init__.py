"""OpenEnv both ways, with openenv-core (the `openenv` extra).

served.py an MMRL environment (the maze, Sokoban, a Gymnasium preset) as an OpenEnv environment: the
`Environment` openenv-core's HTTP/WebSocket server serves, its `MmrlAction` (`message`: the action text)
and `MmrlObservation` (text, base64 PNG images, truncated, info); `mmrl serve openenv`. played.py the
other way: `OpenEnvEnv`, an OpenEnv server's environment played through EnvService (`mmrl serve env
--openenv URL`), one openenv-core client session per episode. Nothing here imports openenv-core until
it is used.
"""
