"""A live experiment whose endpoint cannot run it stops once, before any run."""

import yaml

from loadgen.cli import main
from tests.conftest import make_spec_dict
from tests.servers import free_port


def test_an_unreachable_endpoint_stops_the_experiment_before_any_run(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    code = main(["run", str(spec), "--out", str(tmp_path / "out"), "--endpoint", url, "--quiet", "--no-figures"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("error: ") == 1 and f"{url}: preflight failed, no run started" in err and "not reachable" in err
    assert not (tmp_path / "out" / "runs").exists()  # no run started, no empty table per run
