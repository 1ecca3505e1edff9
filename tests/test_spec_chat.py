"""engine.api and engine.tokenizer in specs: defaults, relative paths, errors naming the field."""

import subprocess
import sys

import yaml

from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict


def test_api_defaults_to_completions_and_a_relative_tokenizer_is_the_spec_directorys(tmp_path):
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    spec = parse_spec(make_spec_dict(engine={"kind": "openai", "url": "http://h:1"}))
    assert spec.engine.api == "completions" and spec.engine.tokenizer is None
    spec = parse_spec(make_spec_dict(engine={"kind": "openai", "url": "http://h:1", "api": "chat", "tokenizer": "tok"}),
                      base_dir=tmp_path)
    assert spec.engine.api == "chat" and spec.engine.tokenizer == str((tmp_path / "tok").resolve())


def test_a_missing_tokenizer_or_an_unknown_api_is_exit_2_naming_the_field(tmp_path):
    for engine, expected in (({"api": "chat", "tokenizer": "nope"}, "engine.tokenizer: no tokenizer.json at"),
                             ({"api": "responses"}, "engine.api: Input should be 'completions' or 'chat'")):
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(make_spec_dict(engine={"kind": "openai", "url": "http://h:1", **engine})))
        done = subprocess.run([sys.executable, "-m", "loadgen.cli", "validate", str(path)], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr


def test_api_flag_is_refused_for_a_simulated_run(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(make_spec_dict()))
    done = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(path), "--out", str(tmp_path / "o"),
                           "--api", "chat"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--api applies to live runs only" in done.stderr
