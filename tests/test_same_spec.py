"""One results directory, one spec: which spec fields make runs incomparable, and moving old runs aside."""

import json

import pytest

from loadgen.core.same_spec import (MixedSpecError, claim_results_dir, compared_fields, describe_differences,
                                    spec_differences)
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict


def _dump(**overrides) -> dict:
    return parse_spec(make_spec_dict(**overrides)).model_dump(mode="json")


def test_seeds_description_endpoint_and_arms_of_one_side_are_not_differences():
    a = _dump()
    b = _dump(seeds=[7], description="rerun on Tuesday")
    b["arms"] = [arm for arm in b["arms"] if arm["name"] == "burst"]  # a run of --arms burst
    assert spec_differences(a, b) == []
    live_a = _dump(engine={"kind": "openai", "url": "http://127.0.0.1:8000"})
    live_b = _dump(engine={"kind": "openai", "url": "http://10.0.0.2:9000/v1"})
    assert spec_differences(live_a, live_b) == []
    # a sim run and a live run are runs of different engines
    assert spec_differences(a, live_a) != []


def test_differences_are_named_by_field_and_arm():
    a = _dump()
    data = make_spec_dict()
    data["workload"]["arrival_rate_per_s"] = 0.05
    data["arms"][1]["triggers"][0]["start_s"] = 180
    b = parse_spec(data).model_dump(mode="json")
    paths = spec_differences(a, b)
    assert paths == ["workload.arrival_rate_per_s", "arms[burst].triggers[0].start_s"]
    assert describe_differences(a, b, paths) == ("workload.arrival_rate_per_s (0.03 vs 0.05), "
                                                 "arms[burst].triggers[0].start_s (120.0 vs 180.0)")


def test_an_optional_field_newer_than_the_recorded_spec_is_no_difference():
    recorded = _dump()
    recorded.pop("time_scale")
    current = {**_dump(), "added_later": None}
    assert spec_differences(recorded, current) == ["time_scale"]  # a default that is not None is a difference
    recorded["time_scale"] = 1.0
    assert spec_differences(recorded, current) == []


def test_compare_checks_workload_triggers_controller_and_seed_but_not_the_engine():
    sim = _dump(seeds=[1])
    real = _dump(seeds=[1], engine={"kind": "openai", "url": "http://127.0.0.1:8000"}, duration_s=900, time_scale=20)
    assert spec_differences(compared_fields(real, "burst"), compared_fields(sim, "burst"), exempt=()) == []
    other_seed = _dump(seeds=[2])
    assert spec_differences(compared_fields(other_seed, "base"), compared_fields(sim, "base"), exempt=()) == ["seeds[0]"]
    data = make_spec_dict(seeds=[1])
    data["arms"][1]["controller"] = {"name": "budgeter"}
    controlled = parse_spec(data).model_dump(mode="json")
    assert spec_differences(compared_fields(controlled, "burst"), compared_fields(sim, "burst"),
                            exempt=()) == ["arms[burst].controller.name"]
    # the base arm of the same two specs ran the same experiment
    assert spec_differences(compared_fields(controlled, "base"), compared_fields(sim, "base"), exempt=()) == []


def _write_run(out, run_id, spec_dict):
    run_dir = out / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "status": "completed", "spec": spec_dict}))


def test_claiming_a_directory_refuses_another_spec_or_moves_its_runs_aside(tmp_path):
    out = tmp_path / "res"
    _write_run(out, "base-s1", _dump(seeds=[1]))
    (out / "summary.json").write_text("{}")
    same = parse_spec(make_spec_dict(seeds=[1, 2, 3]))
    assert claim_results_dir(out, same) is None and (out / "runs" / "base-s1").is_dir()

    data = make_spec_dict()
    data["duration_s"] = 900
    other = parse_spec(data)
    with pytest.raises(MixedSpecError, match=r"base-s1.*duration_s \(600.0 vs 900.0\).*--force-new-spec"):
        claim_results_dir(out, other)
    assert (out / "runs" / "base-s1").is_dir()  # refused: nothing moved

    moved = claim_results_dir(out, other, force_new_spec=True)
    assert moved == out / "previous-1"
    assert (moved / "runs" / "base-s1" / "run.json").is_file() and (moved / "summary.json").is_file()
    assert not (out / "runs").exists() and not (out / "summary.json").exists()
    # a second spec change goes to the next free number
    _write_run(out, "base-s1", other.model_dump(mode="json"))
    assert claim_results_dir(out, same, force_new_spec=True) == out / "previous-2"
