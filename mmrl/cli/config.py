"""`mmrl config {show,validate,docs}`: a config file with every setting's documentation, a check
of one, and the reference page of every setting.

`show FILE [KEY=VALUE ...]` prints the resolved config as YAML that loads back to it, each setting
under its description and with its default where the value differs (`--json`: the same as one
JSON object). `validate FILE` prints one "ok" line, or the one-line error and exit status 2. FILE
is a run config or an SFT config (`--kind`; by default told by its `model` or `base_model` key).
`docs` renders the reference page of the run config, the SFT config and every service's settings
(`mmrl config docs --out docs/configuration.md` regenerates docs/configuration.md).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_settings import BaseSettings

from mmrl.cli.config_reference import markdown_tables, show_json, show_yaml
from mmrl.cli.options import add_overrides, list_actions_in_help, overrides_from
from services.common.config_files import load_model_file, read_user_config
from services.common.messages import summary
from services.common.settings_cli import env_names
from services.common.user_errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def _model(ref: str) -> type[BaseModel]:
    """A model class from "package.module:Class", imported when asked for (the SFT's imports torch)."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Kind:
    """A kind of config file: its model, the key that tells it apart and the commands that read it."""

    title: str
    model: str
    key: str
    read_by: str


KINDS = {
    "run": Kind("run config", "services.coordinator.config:RunConfig", "model",
                "`mmrl run start --config FILE`, `mmrl demo --config FILE`"),
    "sft": Kind("SFT config", "mmrl.sft.config:SftConfig", "base_model",
                "`mmrl sft --config FILE`, `mmrl demo --sft-config FILE`"),
}
# `mmrl serve X`: the module whose `parser()` builds its options, and the models behind them with
# the prefix of their options' argparse destinations.
SERVICES = {
    "coordinator": ("services.coordinator.main", [("services.coordinator.config:CoordinatorSettings", ""),
                                                  ("services.coordinator.triggers.settings:TriggerSettings",
                                                   "trigger.")]),
    "learner": ("services.learner.main", [("services.learner.config:LearnerSettings", ""),
                                          ("services.learner.launch:Launch", "launch.")]),
    "rollout": ("services.rollout.main", [("services.rollout.config:ServerSettings", ""),
                                          ("services.rollout.config:RolloutConfig", "config.")]),
    "env": ("services.env.main", [("services.env.config:ServerSettings", ""),
                                  ("services.env.config:EnvConfig", "config.")]),
    "openenv": ("services.env.openenv.main", [("services.env.openenv.main:OpenEnvSettings", "")]),
}


# Variables read outside the settings models: name -> (who reads it, what it does).
OTHER_VARIABLES = {
    "MMRL_GRPC_TOKEN": ("every gRPC server and the channels of every caller",
                        "Shared token of the gRPC services: when set, a server refuses a call without the metadata "
                        "`authorization: Bearer <token>` (UNAUTHENTICATED; health and reflection excepted) and "
                        "every channel sends it. Unset: nothing is checked. The same value in every service."),
    "MMRL_API_URL": ("`mmrl run`", "The coordinator's URL when `--api` is not given "
                     "(default `http://127.0.0.1:8000`)."),
    "MMRL_API_TOKEN": ("`mmrl run`, `mmrl up`", "The API's bearer token when `--token` is not given; `mmrl up` "
                       "passes it on to the coordinator it starts."),
}


def kind_of(path: Path, overrides: dict[str, Any]) -> str:
    """The kind of config at `path`, told by the key only that kind has."""
    keys = set(read_user_config(path)) | {key.split(".")[0] for key in overrides}
    kinds = [name for name, kind in KINDS.items() if kind.key in keys]
    if len(kinds) != 1:
        raise UsageError(f"{path}: cannot tell which kind of config it is (a run config has 'model', an SFT "
                         "config 'base_model'): pass --kind run or --kind sft")
    return kinds[0]


def _source(model: type[BaseModel]) -> str:
    return str(Path(inspect.getsourcefile(model) or "").resolve().relative_to(ROOT))


def _service_section(command: str, module: str, refs: list[tuple[str, str]]) -> list[str]:
    flags = {action.dest: ", ".join(f"`{o}`" for o in action.option_strings)
             for action in importlib.import_module(module).parser()._actions if action.dest != "help"}
    out = [f"### `mmrl serve {command}`", "", summary(importlib.import_module(module).__doc__), ""]
    for ref, prefix in refs:
        model = _model(ref)
        columns: dict[str, Any] = {"Flag": lambda s, p=prefix: flags.pop(p + s.path, "")}
        if issubclass(model, BaseSettings):
            columns["Environment"] = lambda s, m=model: ", ".join(f"`{n}`" for n in env_names(m, s.path))
        source = f"`{model.__name__}` ({_source(model)})"
        out += [f"{source}: {summary(model.__doc__)}", "", markdown_tables(model, columns, level=4)]
    assert not flags, f"mmrl serve {command}: options no model documents: {sorted(flags)}"
    return out


def reference_page() -> str:
    """docs/configuration.md: every setting of the config files and of the services."""
    out = ["# Configuration reference", "",
           "Generated from the settings models by `mmrl config docs --out docs/configuration.md` (edit the "
           "models' descriptions, then run it; a test fails while this page is stale).", "",
           "A config file is YAML (or TOML); `mmrl config show FILE` prints one with every setting resolved and "
           "documented, `mmrl config validate FILE` checks it. Every command that reads a config also takes "
           "overrides by dotted path, as `KEY=VALUE` words or `--set KEY=VALUE` (e.g. "
           "`mmrl run start --config configs/maze-tiny-cpu.yaml grpo.group_size=4`); `KEY=null` puts a setting "
           "back to its default, e.g. `grpo.group_sampling=plain grpo.max_sampling_rounds=null` on a file that "
           "sets rounds for dynamic sampling (a setting that does nothing in the chosen variant is refused).", ""]
    for kind in KINDS.values():
        model = _model(kind.model)
        out += [f"## {kind.title[0].upper()}{kind.title[1:]}", "",
                f"`{model.__name__}` ({_source(model)}), read by {kind.read_by}: {summary(model.__doc__)}", "",
                markdown_tables(model)]
    out += ["## Services", "",
            "Each service reads its settings from environment variables (what docker-compose.yml and the "
            "Kubernetes manifests set), and a flag of `mmrl serve SERVICE` overrides each one. The engine of the "
            "rollout service and the limits of the env service also come from a YAML or TOML file (`--config`); "
            "a flag overrides the file's value.", ""]
    for command, (module, refs) in SERVICES.items():
        out += _service_section(command, module, refs)
    out += ["### Other environment variables", "",
            "Read outside the settings models above.", "",
            "| Variable | Read by | Description |", "|---|---|---|",
            *(f"| `{name}` | {who} | {what} |" for name, (who, what) in OTHER_VARIABLES.items()), ""]
    return "\n".join(out).rstrip() + "\n"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmrl config", description=summary(__doc__))
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, what in (("show", "print a config with every setting's documentation and default"),
                         ("validate", "check a config: one 'ok' line, or the error and exit status 2")):
        sub = actions.add_parser(action, help=what, description=what[0].upper() + what[1:] + ".")
        sub.add_argument("file", type=Path, help="a run config (configs/maze-tiny-cpu.yaml) or an SFT config")
        add_overrides(sub)
        sub.add_argument("--kind", choices=sorted(KINDS), help="the kind of config (default: told by its keys)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
    docs = actions.add_parser("docs", help="write the reference page of every setting",
                              description="Write the reference page of every setting (Markdown).")
    docs.add_argument("--out", type=Path, help="write it to this file (default: print it)")
    list_actions_in_help(parser, actions)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.action == "docs":
        page = reference_page()
        if args.out is None:
            print(page, end="")
        else:
            args.out.write_text(page)
            print(f"wrote {args.out} ({len(page.splitlines())} lines)")
        return 0
    overrides = overrides_from(args)
    name = args.kind or kind_of(args.file, overrides)
    kind = KINDS[name]
    model = _model(kind.model)
    config = load_model_file(model, args.file, overrides)
    if args.action == "show":
        if args.json:
            print(json.dumps({"kind": name, "file": str(args.file), **show_json(model, config)}))
        else:
            print(show_yaml(model, config, f"{kind.title} {args.file}, resolved (mmrl config show)"), end="")
        return 0
    differ = sum(1 for setting in show_json(model, config)["settings"] if setting["differs"])
    if args.json:
        print(json.dumps({"ok": True, "kind": name, "file": str(args.file), "settings_differing": differ}))
    else:
        print(f"ok: {args.file} is a valid {kind.title} ({differ} settings differ from their defaults)")
    return 0

