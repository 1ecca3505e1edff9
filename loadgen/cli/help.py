"""Help for people: every command's --help opens with what it is for, shows each flag's
default and ends with one example that runs from the repository's root."""

from __future__ import annotations

import argparse
import textwrap

DESCRIPTION = ("agent-loadgen: drive an LLM server (a real one, or a simulated vLLM / SGLang) with AI-agent\n"
               "sessions and measure when its prefix cache collapses and what brings it back.")

# one example per command (the path of subcommand names, space-separated)
EXAMPLES = {
    "": "loadgen run examples/paired-burst.yaml --out results/paired-burst",
    "run": "loadgen run examples/paired-burst.yaml --out results/paired-burst",
    "sweep": "loadgen sweep examples/paired-burst-vllm.yaml --out results/paired-burst-vllm",
    "map": "loadgen map examples/map.yaml --out results/map --seeds 1-35 --budgets 0.6,0.75,0.9",
    "serve-sim": "loadgen serve-sim --port 8000 --time-scale 10",
    "report": "loadgen report results/paired-burst --html",
    "calibrate": "loadgen calibrate --endpoint http://127.0.0.1:8000 --out cost.json",
    "compare": "loadgen compare results/real results/sim",
    "validate": "loadgen validate examples/paired-burst.yaml",
    "cost-fit": "loadgen cost-fit",
    "shapes": "loadgen shapes describe swebench",
    "shapes describe": "loadgen shapes describe trace.jsonl --format mooncake",
    "export": "loadgen export results/paired-burst --format csv",
    "gateway": "loadgen gateway --upstream http://127.0.0.1:8000 --controller budgeter --listen 127.0.0.1:9000",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The example keeps its line breaks; a flag with a default says it, unless its help does."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("%(default)" not in text and "default" not in text and action.option_strings
                and action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0):
            text += " (default: %(default)s)"
        return text


def subcommands(parser: argparse.ArgumentParser, path: str = ""):
    """(path, parser, one-line help) of every subcommand under ``parser``, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                sub_path = f"{path} {name}".strip()
                yield sub_path, sub, helps.get(name)
                yield from subcommands(sub, sub_path)


def apply_help(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The description, defaults and example of the top parser and of every subcommand (a
    command without an example in EXAMPLES is a KeyError: tests/test_help.py walks them all)."""
    parser.description = DESCRIPTION
    parser.epilog = f"example:\n  {EXAMPLES['']}\n\nmore: loadgen COMMAND --help"
    parser.formatter_class = HelpFormatter
    for path, sub, line in subcommands(parser):
        if not sub.description and line:
            sub.description = textwrap.fill(line[0].upper() + line[1:] + ".", 88)
        sub.epilog = (f"{sub.epilog}\n\n" if sub.epilog else "") + f"example:\n  {EXAMPLES[path]}"
        sub.formatter_class = HelpFormatter
    return parser
