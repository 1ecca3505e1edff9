"""Help for people: `loadgen --help` says what the tool is for; every command's --help says
what it is for in one line, shows its defaults and ends with one example that parses."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from loadgen.cli.help import EXAMPLES, subcommands
from loadgen.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [path for path, _, _ in subcommands(build_parser())]


def test_loadgen_help_opens_with_what_the_tool_is_for():
    text = build_parser().format_help()
    after_usage = text.split("\n\n")[1]
    assert after_usage.startswith("agent-loadgen: drive an LLM server")
    assert "The command line" not in text and "the function that runs it" not in text
    assert text.rstrip().endswith("more: loadgen COMMAND --help")
    assert f"example:\n  {EXAMPLES['']}" in text


@pytest.mark.parametrize("path", COMMANDS)
def test_every_command_says_what_it_is_for_shows_defaults_and_ends_with_an_example(path):
    parser = dict((p, sub) for p, sub, _ in subcommands(build_parser()))[path]
    text = parser.format_help()
    description = text.split("\n\n")[1]
    assert len(description) < 240 and all(len(line) <= 88 for line in description.splitlines()), description
    assert description.strip().endswith(".")
    example = EXAMPLES[path]
    assert text.rstrip().endswith(f"example:\n  {example}")
    for action in parser._actions:
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
            flag = action.option_strings[-1]
            entry = re.search(r"\n  (?:-\w+, )?" + re.escape(flag) + r"\b(.*?)(?=\n  -|\n\n)", text, re.S)
            assert entry and "default" in entry.group(1), f"{path} {flag}: no default shown"
    # the example parses, and the files it names ship with the repository
    args = shlex.split(example)[1:]
    if not any(a in ("--help",) for a in args):
        build_parser().parse_args(args)
    for arg in args:
        if arg.startswith("examples/"):
            assert (ROOT / arg).is_file(), arg


def test_serve_sim_help_explains_host_and_port():
    parser = dict((p, sub) for p, sub, _ in subcommands(build_parser()))["serve-sim"]
    text = parser.format_help()
    text = text[text.index("options:"):]
    host = text[text.index("--host HOST"):text.index("--port PORT")]
    assert "listen" in host and "127.0.0.1" in host
    port = text[text.index("--port PORT"):text.index("--time-scale")]
    assert "TCP port" in port and "8000" in port


def test_gateway_help_lists_the_controllers_and_what_each_session_header_does():
    from controllers.registry import POLICIES
    from loadgen.gateway.config import SESSION_FINAL_HEADER, SESSION_HEADERS

    text = dict((p, sub) for p, sub, _ in subcommands(build_parser()))["gateway"].format_help()
    options = text[text.index("options:"):]
    controller = " ".join(options[options.index("--controller NAME"):options.index("--controller-option")].split())
    assert all(name in controller for name in POLICIES)
    headers = text[text.index("session headers"):text.index("example:")]
    assert all(name in headers for name in SESSION_HEADERS) and f"{SESSION_FINAL_HEADER}: true" in headers
    assert "frees its" in headers and text.rstrip().endswith("--listen 127.0.0.1:9000")


HEAVY = ("numpy", "pydantic", "pyarrow", "loadgen.core.spec", "loadgen.analysis")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["runx"], ["run", "--no-such-flag"]])
def test_help_and_a_mistyped_command_import_none_of_what_the_commands_need(argv):
    """`loadgen --help` and `loadgen run --help` answer in a blink: only the named command's flags
    are built, and no command's module is imported until it runs (benchmarks/bench_cli.py times it)."""
    import subprocess
    import sys

    code = ("import sys\nfrom loadgen.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_full_command_line_and_one_command_parse_alike():
    """main() builds only the named command's flags: they parse a command line as the full parser does."""
    argv = ["run", "examples/paired-burst.yaml", "--out", "x", "--seeds", "501", "--no-figures"]
    assert vars(build_parser().parse_args(argv)).keys() == vars(build_parser("run").parse_args(argv)).keys()
    assert build_parser("run").parse_args(argv).seeds == "501"


def test_compare_help_names_the_folder_compare_writes_to_without_out(tmp_path):
    from loadgen.analysis.compare import default_out_dir

    parser = dict((p, sub) for p, sub, _ in subcommands(build_parser()))["compare"]
    text = " ".join(parser.format_help().split())
    assert "default REAL_DIR/compare-vs-NAME, NAME the last part of SIM_DIR" in text
    assert default_out_dir(tmp_path / "real", tmp_path / "sims" / "twin") == tmp_path / "real" / "compare-vs-twin"
