"""The Python requirements each image flavour installs, read from pyproject.toml.

    python3 image-requirements.py all|light [PYPROJECT]

- all (rollout and learner, cpu and gpu): the project's dependencies and the `tracing` extra.
- light (env and coordinator): the same but for the packages that pull torch (peft) or serve only
  `mmrl demo`'s plots (matplotlib), plus the extras of the env service's own modules: `gym`
  (`mmrl serve env --gymnasium`) and `openenv` (`mmrl serve openenv`, `--openenv`).

The Dockerfile's light stage imports every module of env and coordinator, so a module-level import
of a package missing here fails the image build; tests/deploy/test_image_requirements.py runs the
same check without Docker.
"""

from __future__ import annotations

import sys
import tomllib

FLAVOURS = ("all", "light")
# Extras every image carries.
EXTRAS_ALL = ("tracing",)
# Extras only env and coordinator carry: the env service's Gymnasium and OpenEnv modules.
EXTRAS_LIGHT = ("gym", "openenv")
# Left out of the light images (by requirement name).
NOT_LIGHT = ("peft", "matplotlib")


def _name(requirement: str) -> str:
    for stop in "<>=!~;[ ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.strip().lower()


def image_requirements(project: dict, flavour: str) -> list[str]:
    """The requirement lines of `flavour` for the `[project]` table of pyproject.toml."""
    if flavour not in FLAVOURS:
        raise ValueError(f"flavour must be one of {', '.join(FLAVOURS)}, not {flavour!r}")
    extras = project["optional-dependencies"]
    lines = list(project["dependencies"]) + [r for extra in EXTRAS_ALL for r in extras[extra]]
    if flavour == "light":
        lines = [r for r in lines if _name(r) not in NOT_LIGHT]
        lines += [r for extra in EXTRAS_LIGHT for r in extras[extra]]
    return lines


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or argv[0] not in FLAVOURS:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path = argv[1] if len(argv) == 2 else "pyproject.toml"
    with open(path, "rb") as f:
        project = tomllib.load(f)["project"]
    print("\n".join(image_requirements(project, argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
