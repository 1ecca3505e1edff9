"""The gateway's settings: a file and flags, validated; the map's recommendation as the controller."""

import json

import pytest

from loadgen.core.spec import SpecError
from loadgen.gateway.config import from_map, load_config, parse_option
from loadgen.gateway.upstream_choice import sticky_hash


def test_flags_override_the_file_and_controller_options_merge(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("upstreams: [http://127.0.0.1:8000/v1]\ncontroller: budgeter\n"
                    "controller_options: {admit_fraction: 0.5}\nidle_timeout_s: 60\n")
    cfg = load_config(str(path), {"idle_timeout_s": 30.0, "controller_options": {"park_fraction": 0.8},
                                  "listen": None})
    assert cfg.upstreams == ["http://127.0.0.1:8000"] and cfg.idle_timeout_s == 30.0
    assert cfg.controller_options == {"admit_fraction": 0.5, "park_fraction": 0.8}
    assert cfg.host == "127.0.0.1" and cfg.port == 9000 and cfg.pool_tokens == "auto"


@pytest.mark.parametrize("overrides, field", [
    ({"upstreams": ["https://x:1"]}, "upstreams"),
    ({"upstreams": ["http://a:1", "http://a:1"]}, "upstreams"),
    ({"listen": "9000"}, "listen"),
    ({"pool_tokens": 0}, "pool_tokens"),
    ({"session_headers": ["bad header"]}, "session_headers"),
    ({"on_max_park": "drop"}, "on_max_park"),
    ({"controller": "session-cap", "controller_options": {"k": 0}}, "controller"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"router": "nope"}, "router"),
    ({"router": "consistent_hash", "router_options": {"virtual_nodes": 0}}, "router_options"),
    ({"router": "sticky-hash", "router_options": {"k": 1}}, "router_options"),
])
def test_a_bad_setting_names_its_field(overrides, field):
    with pytest.raises(SpecError, match=f"  {field}"):
        load_config(None, {"upstreams": ["http://127.0.0.1:1"], **overrides})


def test_controller_options_are_read_as_yaml_values():
    assert parse_option("k=14") == ("k", 14) and parse_option("admit_fraction=0.7") == ("admit_fraction", 0.7)
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_option("k")


def test_the_maps_recommendation_is_the_budgeter_with_its_fractions(tmp_path):
    (tmp_path / "map.json").write_text(json.dumps({"recommendation": {
        "controller": "budgeter", "admit_fraction": 0.7, "park_fraction": 0.9, "budget_tokens": 280000.0}}))
    assert from_map(str(tmp_path)) == {"controller": "budgeter",
                                       "controller_options": {"admit_fraction": 0.7, "park_fraction": 0.9}}
    (tmp_path / "map.json").write_text(json.dumps({"recommendation": None}))
    with pytest.raises(SpecError, match="no recommendation"):
        from_map(str(tmp_path))


def test_a_session_keeps_its_upstream_and_sessions_spread_over_upstreams():
    keys = [f"h:s{i}" for i in range(2000)]
    picks = [sticky_hash(k, 4) for k in keys]
    assert picks == [sticky_hash(k, 4) for k in keys]
    assert all(abs(picks.count(i) - 500) < 100 for i in range(4))
    # rendezvous hashing: removing upstream 3 moves only its sessions
    assert all(sticky_hash(k, 3) == p for k, p in zip(keys, picks) if p != 3)


@pytest.mark.parametrize("text", ["controller_options:\n", "controller_options: 0.7\n", "router_options: [a]\n"])
def test_an_empty_or_non_mapping_options_key_names_the_field(tmp_path, text):
    path = tmp_path / "g.yaml"
    path.write_text("upstreams: [http://127.0.0.1:8000]\n" + text)
    field = text.split(":")[0]
    with pytest.raises(SpecError, match=f"{field}: expected a mapping of KEY: VALUE"):
        load_config(str(path), {})


def test_a_recommendation_without_its_fractions_names_what_it_lacks(tmp_path):
    (tmp_path / "map.json").write_text(json.dumps({"recommendation": {"controller": "budgeter", "park_fraction": 0.9}}))
    with pytest.raises(SpecError, match="the recommendation lacks admit_fraction"):
        from_map(str(tmp_path))
