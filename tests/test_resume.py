"""`loadgen run --resume` skips exactly the runs completed with the same spec; live progress and
the up-front wall-time estimate."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from loadgen.cli import main
from loadgen.live.progress import LiveProgress, describe_estimate, wall_time_left_s
from tests.conftest import make_spec_dict


def _spec_file(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(make_spec_dict(**overrides)))
    return path


def _mtimes(out: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*/turns.parquet")}


def test_resume_skips_exactly_the_completed_runs(tmp_path, capsys):
    spec = _spec_file(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-figures"]) == 0
    before = _mtimes(out)
    assert sorted(before) == ["base-s1", "base-s2", "burst-s1", "burst-s2"]
    # one run failed, one is of another spec (an edited seed list is the same spec; a changed
    # arrival rate is not, and is refused by the directory check: edit the run's own record)
    failed = out / "runs" / "burst-s1" / "run.json"
    failed.write_text(json.dumps({**json.loads(failed.read_text()), "status": "failed"}))
    capsys.readouterr()
    assert main(["run", str(spec), "--resume", str(out), "--quiet", "--no-figures"]) == 0
    err = capsys.readouterr().err
    assert "--resume: 3 of 4 runs already completed with this spec" in err
    after = _mtimes(out)
    assert [run for run in after if after[run] != before[run]] == ["burst-s1"]
    assert json.loads(failed.read_text())["status"] == "completed"
    assert (out / "runs" / "burst-s1" / "windows.parquet").is_file()


def test_resume_with_the_spec_and_out_and_bad_resume_arguments(tmp_path, capsys):
    spec = _spec_file(tmp_path)
    out = tmp_path / "out"
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report", "--seeds", "1"]) == 0
    before = _mtimes(out)
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report", "--resume"]) == 0
    after = _mtimes(out)
    assert {r: after[r] for r in before} == before and sorted(after) == sorted([*before, "base-s2", "burst-s2"])
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "no spec.yaml there" in capsys.readouterr().err
    assert main(["run", "--out", str(out)]) == 2
    assert "loadgen run needs a SPEC (or --resume DIR)" in capsys.readouterr().err


def test_the_estimate_says_how_long_the_whole_spec_takes():
    assert describe_estimate(24, 5400.0, 1.0) == ("24 runs x 90 min at time scale 1, one after another: "
                                                  "about 36 h of wall time")
    assert describe_estimate(4, 600.0, 20.0).endswith("about 2 min of wall time")


def _sample(t_s: float, turns: int, queries: int, hits: int, sessions: int) -> dict:
    return {"t_s": t_s, "turns_completed_total": turns, "prefix_cache_queries_total": queries,
            "prefix_cache_hits_total": hits, "sessions_in_system": sessions}


def test_live_progress_reports_the_last_minute_and_the_time_left():
    progress = LiveProgress(duration_s=600.0)
    first = progress.sample(_sample(0.0, 0, 0, 0, 0))
    assert first.turns_per_s is None and first.hit_ratio is None
    progress.sample(_sample(30.0, 10, 1000, 500, 4))
    snapshot = progress.sample(_sample(90.0, 70, 5000, 4100, 6))
    # the reference is the sample at 30 s (the newest at least 60 s back): 60 turns, 3600/4000 hits
    assert snapshot.turns_per_s == 1.0 and snapshot.hit_ratio == 0.9 and snapshot.sessions_in_system == 6
    assert snapshot.describe() == "1:30/10:00 run time, 1.00 turns/s, hit 0.90, 6 sessions in system"
    # two runs not started and 510 s of this one, at time scale 10
    assert wall_time_left_s(2, snapshot, 600.0, 10.0) == 120.0 + 51.0
