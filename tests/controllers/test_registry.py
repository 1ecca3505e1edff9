"""The registry: exact names, documented defaults, and clear errors for bad names and params."""

import pytest

from controllers import POLICIES, make_policy, policy_params


def test_the_six_limits_of_spec_section_5_by_name():
    assert list(POLICIES) == ["none", "admission-only", "session-cap", "adaptive-cap", "aimd", "budgeter",
                              "thunderagent"]


def test_defaults_are_the_spec_constants():
    assert policy_params("admission-only") == {"k": 16}
    assert policy_params("session-cap") == {"k": 14, "k_hi": 17}
    assert policy_params("adaptive-cap") == {"admit_fraction": 0.75, "park_fraction": 0.95, "alpha": 0.02}
    assert policy_params("budgeter") == {"admit_fraction": 0.75, "park_fraction": 0.95}
    aimd = policy_params("aimd")
    assert (aimd["initial_k"], aimd["update_interval_s"], aimd["latency_threshold_s"], aimd["decrease_factor"]) == (
        32, 10.0, 15.0, 0.5)


def test_each_call_makes_a_fresh_policy():
    assert make_policy("aimd") is not make_policy("aimd")


def test_unknown_controller_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown controller 'magic'.*'budgeter'"):
        make_policy("magic")


def test_unknown_param_names_the_controller_and_its_params():
    with pytest.raises(ValueError) as info:
        make_policy("session-cap", k=10, khi=12)
    assert str(info.value) == "controller 'session-cap': unknown parameter(s) ['khi']; valid parameters: ['k', 'k_hi']"
    with pytest.raises(ValueError, match="controller 'none': unknown parameter.*valid parameters: none"):
        make_policy("none", k=1)


@pytest.mark.parametrize("name,params,message", [
    ("session-cap", {"k": 20}, "k_hi \\(17\\) must be >= k \\(20\\)"),
    ("session-cap", {"k": 0}, "k must be an integer >= 1"),
    ("admission-only", {"k": True}, "k must be an integer"),
    ("budgeter", {"admit_fraction": 0.9, "park_fraction": 0.8}, "admit_fraction .* must be <= park_fraction"),
    ("budgeter", {"admit_fraction": "0.7"}, "admit_fraction must be a positive number"),
    ("adaptive-cap", {"alpha": 1.5}, "alpha must be in"),
    ("aimd", {"decrease_factor": 1.0}, "decrease_factor must be < 1"),
    ("aimd", {"initial_k": 64, "max_k": 40}, "initial_k .* must lie in"),
])
def test_bad_constants_are_errors_naming_the_controller(name, params, message):
    with pytest.raises(ValueError, match=f"controller '{name}': {message}"):
        make_policy(name, **params)
