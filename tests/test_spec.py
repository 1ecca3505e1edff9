from pathlib import Path

import pytest

from loadgen.core.spec import SpecError, load_spec, parse_seeds, parse_spec
from tests.conftest import make_spec_dict


def test_minutes_are_accepted_and_converted():
    data = make_spec_dict()
    del data["duration_s"]
    data["duration_min"] = 90
    data["arms"][1]["triggers"][0] = {"kind": "burst", "extra_rate_factor": 1.5, "start_min": 15, "duration_min": 5}
    spec = parse_spec(data)
    assert spec.duration_s == 5400
    assert spec.arms[1].triggers[0].window() == (900, 1200)


@pytest.mark.parametrize("value,expected", [("501-503", [501, 502, 503]), ("1,4-5", [1, 4, 5]), (7, [7]),
                                            ([3, 2], [3, 2])])
def test_seed_forms(value, expected):
    assert parse_seeds(value) == expected


def _error(data) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "my.yaml")
    return str(info.value)


def test_unknown_field_is_named():
    msg = _error(make_spec_dict(colour="blue"))
    assert "my.yaml" in msg and "colour" in msg and "unknown field" in msg


def test_negative_rate_is_named():
    data = make_spec_dict()
    data["workload"]["arrival_rate_per_s"] = -1
    msg = _error(data)
    assert "workload.arrival_rate_per_s" in msg and "greater than 0" in msg


def test_trigger_after_the_run_ends():
    data = make_spec_dict()
    data["arms"][1]["triggers"][0]["start_s"] = 590
    msg = _error(data)
    assert "arms[1].triggers[0]" in msg and "after the run" in msg


def test_unknown_controller_lists_valid_ones():
    msg = _error(make_spec_dict(controller={"name": "magic"}))
    assert "magic" in msg and "'none'" in msg


def test_unknown_session_kind():
    data = make_spec_dict()
    data["workload"]["sessions"]["kind"] = "tracelab-from-mars"
    msg = _error(data)
    assert "workload.sessions" in msg and "synthetic" in msg


def test_pool_smaller_than_one_session():
    data = make_spec_dict()
    data["engine"]["pool_tokens"] = 6400
    msg = _error(data)
    assert "pool_tokens=6400" in msg and "smaller than one session" in msg


def test_unknown_cost_preset_lists_presets():
    data = make_spec_dict()
    data["engine"]["cost_model"] = "gpt-9"
    msg = _error(data)
    assert "engine.cost_model" in msg and "qwen3-8b-mi300x" in msg


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(bad)


def test_example_specs_are_valid():
    from pathlib import Path

    for path in sorted(Path(__file__).parents[1].joinpath("examples").glob("*.yaml")):
        load_spec(path)


def test_unknown_controller_param_names_the_controller_and_its_params():
    data = make_spec_dict()
    data["arms"][1]["controller"] = {"name": "session-cap", "params": {"k": 10, "khi": 12}}
    msg = _error(data)
    assert "arms[1].controller" in msg and "controller 'session-cap'" in msg
    assert "unknown parameter(s) ['khi']" in msg and "valid parameters: ['k', 'k_hi']" in msg


def test_bad_controller_constant_is_a_spec_error():
    msg = _error(make_spec_dict(controller={"name": "budgeter", "params": {"admit_fraction": 0.99}}))
    assert "controller: controller 'budgeter': admit_fraction (0.99) must be <= park_fraction (0.95)" in msg


def test_engine_flavor_and_per_arm_engine_fields():
    data = make_spec_dict()
    data["engine"] = {"kind": "sim", "pool_tokens": 400000}
    data["arms"][1]["engine"] = {"flavor": "sglang", "sglang": {"schedule_policy": "lpm"}}
    spec = parse_spec(data)
    base, other = (spec.engine_for(arm) for arm in spec.arms)
    assert (base.flavor, other.flavor, other.sglang.schedule_policy, other.pool_tokens) == ("vllm", "sglang", "lpm",
                                                                                             400000)


@pytest.mark.parametrize("engine,arm_engine,expected", [
    ({"kind": "sim", "flavor": "sglong"}, None, "engine.flavor: Input should be 'vllm' or 'sglang'"),
    ({"kind": "sim", "flavor": "sglang", "enable_prefix_caching": False}, None, "is not modelled"),
    ({"kind": "sim"}, {"flavor": "sglang", "sglang": {"page_size": 0}}, "arms[1].engine.sglang.page_size"),
    ({"kind": "sim"}, {"kind": "openai"}, "arms[1].engine: an arm changes fields of the sim engine, not its kind"),
    ({"kind": "openai", "url": "http://127.0.0.1:1"}, {"flavor": "sglang"}, "apply to the simulated engine"),
])
def test_bad_engine_flavors_name_the_field(engine, arm_engine, expected):
    data = make_spec_dict()
    data["engine"] = engine
    if arm_engine is not None:
        data["arms"][1]["engine"] = arm_engine
    msg = _error(data)
    assert msg.startswith("my.yaml: ") and expected in msg, msg


@pytest.mark.parametrize("path", sorted(Path(__file__).resolve().parents[1].glob("examples/*.yaml")),
                         ids=lambda p: p.name)
def test_a_resolved_spec_loads_back_as_the_same_spec(path):
    """DIR/spec.yaml and run.json hold the resolved spec; `--resume` and the same-spec check read it back."""
    spec = load_spec(path)
    again = parse_spec(spec.model_dump(mode="json"), f"{path.name} (resolved)", base_dir=path.parent)
    assert again == spec
