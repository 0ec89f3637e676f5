"""MMRL: multi-turn reinforcement learning for vision-language agents.

`mmrl.v1` holds the gRPC stubs generated from `protos/mmrl/v1/*.proto` (never edited by hand:
`make protos` regenerates them); `mmrl.cli` is the `mmrl` command line.
"""

__version__ = "0.1.0"
