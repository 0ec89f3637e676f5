"""Options the `mmrl` commands share: config overrides, given as `KEY=VALUE` words or with
`--set KEY=VALUE`, and a `--help` that shows every action of a command with its options."""

from __future__ import annotations

import argparse
import textwrap
from typing import Any

from services.common.config_files import parse_overrides

OVERRIDES_HELP = ("override a config setting by its dotted path, e.g. grpo.group_size=4 (the value is read as "
                  "YAML: 4 a number, [a, b] a list, null none)")


def add_overrides(parser: argparse.ArgumentParser, what: str = "config") -> None:
    """`KEY=VALUE ...` (positional) and `--set KEY=VALUE` (repeatable), read by `overrides_from`."""
    help_text = OVERRIDES_HELP.replace("config", what, 1)
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=help_text)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the same as KEY=VALUE")


def overrides_from(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides given either way ({"grpo.group_size": 4}); the later one of a key wins."""
    return parse_overrides([*args.set, *args.overrides])


def list_actions_in_help(parser: argparse.ArgumentParser, actions: argparse._SubParsersAction) -> None:
    """Makes `parser --help` end with each action's usage, summary and options (those `parser`
    shows itself left out). Call it once every action has been added."""
    shared = {a.dest for a in parser._actions}
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parts = []
    for sub in dict.fromkeys(actions.choices.values()):  # an alias shares its action's parser
        formatter = sub._get_formatter()
        formatter.add_usage(sub.usage, sub._actions, sub._mutually_exclusive_groups, prefix="")
        formatter.add_text(sub.description)
        formatter.add_arguments([a for a in sub._actions if a.dest not in shared])
        parts.append(textwrap.indent(formatter.format_help().rstrip(), "  "))
    parser.epilog = "actions:\n" + "\n\n".join(parts)
