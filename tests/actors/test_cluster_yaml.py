"""cluster.yaml against the schema shipped in the ray wheel and Ray's own config preparation."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


def _schema() -> dict:
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def _with_nvidia_nodes() -> dict:
    """cluster.yaml with its commented NVIDIA node type switched on instead of the MI300X one."""
    text = CLUSTER_YAML.read_text()
    block = re.search(r"^  # h100:\n(?:^  #   .*\n)+", text, flags=re.MULTILINE)
    assert block, "cluster.yaml lost its commented NVIDIA node type"
    config = yaml.safe_load(text)
    nodes = yaml.safe_load(re.sub(r"^  # ", "", block.group(0), flags=re.MULTILINE))
    del config["available_node_types"]["mi300x"]
    config["available_node_types"].update(nodes)
    return config


@pytest.mark.parametrize("variant", ["mi300x", "h100"])
def test_cluster_yaml_passes_rays_schema_and_config_preparation(variant):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(CLUSTER_YAML.read_text()) if variant == "mi300x" else _with_nvidia_nodes()
    jsonschema.validate(config, _schema())
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    gpu_node = prepared["available_node_types"][variant]
    assert gpu_node["resources"]["GPU"] == 8
    assert variant.upper() in gpu_node["node_config"]["azure_arm_parameters"]["vmSize"]
    assert "GPU" not in prepared["available_node_types"][prepared["head_node_type"]]["resources"]
    assert any("agent-loadgen[ray]" in command for command in prepared["setup_commands"])
