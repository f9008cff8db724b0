"""Cluster files: the shipped shapes, validation messages, and ground-truth coverage."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.protocol.profile import default_profiles_dir, load_gpu_types
from sia_slurm.sim.apps import DATA_PARALLEL_APPS
from sia_slurm.sim.clusterfile import ClusterError, check_ground_truth, load_cluster, parse_cluster

from .conftest import CLUSTERS_DIR, TRACES_DIR

PROFILE_TYPES = set(load_gpu_types(default_profiles_dir() / "gpu_types.csv"))


@pytest.mark.parametrize(
    ("name", "total", "shape"),
    [
        (
            "hetero64",
            64,
            [
                ("t4", "t4", "aws", 4, 6),
                ("rtx", "rtx", "rtx", 8, 3),
                ("a100", "dgx", "dgx-ext", 8, 2),
            ],
        ),
        ("homo64", 64, [("t4", "t4", "aws", 4, 16)]),
        (
            "physical44",
            44,
            [
                ("rtx", "rtx", "rtx", 8, 3),
                ("a100", "dgx", "dgx-ext", 8, 2),
                ("quad", "quad", "quad", 4, 1),
            ],
        ),
    ],
)
def test_shipped_clusters(
    name: str, total: int, shape: list[tuple[str, str, str, int, int]]
) -> None:
    cluster = load_cluster(CLUSTERS_DIR / f"{name}.yaml", profile_types=PROFILE_TYPES)
    assert cluster.name == name
    assert cluster.total_gpus == total
    assert [
        (t.name, t.profile, t.trace_key, t.gpus_per_node, t.nodes) for t in cluster.gpu_types
    ] == shape


@pytest.mark.parametrize("name", ["hetero64", "homo64", "physical44"])
def test_shipped_clusters_have_ground_truth_for_data_parallel_apps(name: str) -> None:
    cluster = load_cluster(CLUSTERS_DIR / f"{name}.yaml")
    assert check_ground_truth(cluster, DATA_PARALLEL_APPS, TRACES_DIR) == ()


def test_check_ground_truth_reports_missing_pairs() -> None:
    cluster = load_cluster(CLUSTERS_DIR / "hetero64.yaml")
    missing = check_ground_truth(cluster, ["gpt_pmp", "cifar10"], TRACES_DIR)
    assert [(m.app, m.gpu_type, m.trace_key) for m in missing] == [("gpt_pmp", "t4", "aws")]
    assert missing[0].path == TRACES_DIR / "gpt_pmp" / "placements-aws.csv"


def _errors(text: str) -> str:
    with pytest.raises(ClusterError) as err:
        parse_cluster(text, Path("c.yaml"), profile_types=PROFILE_TYPES)
    return str(err.value)


def test_bad_values_are_all_reported_with_lines() -> None:
    text = """\
name: c
gpu_types:
  t4:
    profile: t4
    trace_key: aws
    gpus_per_node: 0
    nodes: -2
  a100:
    profile: a100
    gpus_per_node: 8
    nodes: 2
    colour: green
"""
    assert _errors(text) == "\n".join(
        [
            "c.yaml:6: gpu_types.t4.gpus_per_node: expected a positive integer, got 0",
            "c.yaml:7: gpu_types.t4.nodes: expected a positive integer, got -2",
            "c.yaml:8: gpu_types.a100.trace_key: expected the GPU type's key in data/traces/ "
            "(e.g. aws), got nothing (missing)",
            "c.yaml:9: gpu_types.a100.profile: expected one of dgx, quad, rtx, t4, v100 "
            "(profiles/gpu_types.csv), got 'a100'",
            "c.yaml:12: gpu_types.a100.colour: unknown key; valid keys here: profile, trace_key, "
            "gpus_per_node, nodes",
        ]
    )


def test_unknown_top_level_key_and_missing_gpu_types() -> None:
    assert _errors("name: c\nnodes: 3\n") == "\n".join(
        [
            "c.yaml: gpu_types: expected a mapping of GPU type name to its settings, got nothing",
            "c.yaml:2: nodes: unknown key; valid keys here: name, description, gpu_types, restart",
        ]
    )


def test_missing_counts_and_bad_yaml() -> None:
    text = "gpu_types:\n  t4:\n    trace_key: aws\n"
    assert _errors(text) == "\n".join(
        [
            "c.yaml:2: gpu_types.t4.gpus_per_node: expected a positive integer, got nothing "
            "(missing)",
            "c.yaml:2: gpu_types.t4.nodes: expected a positive integer, got nothing (missing)",
        ]
    )
    assert _errors("gpu_types: [\n").startswith("c.yaml:2: invalid YAML:")


def test_profile_defaults_to_the_type_name() -> None:
    cluster = parse_cluster(
        "gpu_types:\n  rtx: {trace_key: rtx, gpus_per_node: 8, nodes: 1}\n", Path("tiny.yaml")
    )
    assert cluster.name == "tiny"
    assert cluster.gpu_type("rtx").profile == "rtx"
    with pytest.raises(KeyError, match="has no GPU type 't4'"):
        cluster.gpu_type("t4")


def test_restart_section_is_read_and_checked() -> None:
    tiny = "gpu_types:\n  rtx: {trace_key: rtx, gpus_per_node: 8, nodes: 1}\n"
    assert parse_cluster(tiny).restart is None
    cluster = parse_cluster(tiny + "restart: {start_s: 9, move_s: 15.5}\n")
    assert cluster.restart is not None
    assert (cluster.restart.start_s, cluster.restart.move_s) == (9.0, 15.5)
    assert _errors(tiny + "restart: {start_s: -1, move_s: yes, after_s: 2}\n") == "\n".join(
        [
            "c.yaml:3: restart.after_s: unknown key; valid keys here: start_s, move_s",
            "c.yaml:3: restart.start_s: expected a number of seconds >= 0, got -1",
            "c.yaml:3: restart.move_s: expected a number of seconds >= 0, got True",
        ]
    )
    assert _errors(tiny + "restart: 10\n") == (
        "c.yaml:3: restart: expected a mapping with keys start_s, move_s, got 10"
    )
