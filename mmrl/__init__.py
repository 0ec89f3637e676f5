"""MMRL: multi-turn reinforcement learning for vision-language agents.

`mmrl` is the top layer: the `mmrl` command line (`mmrl.cli`) and the offline jobs it runs (SFT,
export, benchmarks, the demo's report). The services live in `services`, the generated gRPC stubs in
`mmrl_proto`.
"""

__version__ = "0.1.0"
