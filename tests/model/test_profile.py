"""Profile loader: the shipped profiles load; each malformed case names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.protocol.profile import (
    ProfileError,
    ProfileSet,
    load_profiles,
    parse_placement,
    read_trace_points,
)

from .conftest import TRACES_DIR

APPS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
TYPES = ["dgx", "quad", "rtx", "t4", "v100"]


def set_line(path: Path, lineno: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[lineno - 1] = text
    path.write_text("\n".join(lines) + "\n")


def load_error(root: Path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profiles(root)
    return str(info.value)


def test_shipped_profiles_load(profiles: ProfileSet) -> None:
    assert sorted(profiles.apps) == APPS
    assert sorted(profiles.gpu_types) == TYPES
    assert profiles.gpu_types["t4"].gpus_per_node == 4
    assert profiles.gpu_types["dgx"].trace_key == "dgx-ext"
    cifar = profiles.app("cifar10")
    assert (cifar.init_batch_size, cifar.max_batch_size, cifar.min_local_bsz) == (128, 4096, 32)
    assert cifar.gpu_types == tuple(TYPES)
    assert dict(cifar.max_local_bsz) == {
        "dgx": 4096,
        "quad": 2048,
        "rtx": 1024,
        "t4": 1024,
        "v100": 3072,
    }
    assert len(cifar.seed["dgx"]) == 15
    first = cifar.seed["dgx"][0]
    assert (first.nodes, first.gpus, first.local_bsz) == (1, 1, 32)
    assert first.step_time == pytest.approx(0.035044655203819275)
    for app in profiles.apps.values():
        assert set(app.seed) == set(app.max_local_bsz)
        for gpu_type, points in app.seed.items():
            assert all(p.local_bsz <= app.max_local_bsz[gpu_type] for p in points)


def test_unknown_app_lists_the_known_ones(profiles: ProfileSet) -> None:
    with pytest.raises(
        ProfileError, match="no profile for app 'gpt3' \\(known apps: bert, cifar10"
    ):
        profiles.app("gpt3")


def test_negative_step_time(profiles_copy: Path) -> None:
    seed = profiles_copy / "cifar10" / "seed.csv"
    set_line(seed, 7, "dgx,182,1,-0.3,0.0002")
    assert load_error(profiles_copy) == f"{seed}:7: step_time: expected a positive number, got -0.3"


def test_missing_column(profiles_copy: Path) -> None:
    seed = profiles_copy / "cifar10" / "seed.csv"
    lines = seed.read_text().splitlines()
    seed.write_text("\n".join(",".join(line.split(",")[:4]) for line in lines) + "\n")
    assert load_error(profiles_copy) == (
        f"{seed}:1: header: expected columns gpu_type,local_bsz,placement,step_time,sync_time, "
        "missing sync_time (found gpu_type,local_bsz,placement,step_time)"
    )


def test_unknown_gpu_type(profiles_copy: Path) -> None:
    seed = profiles_copy / "bert" / "seed.csv"
    set_line(seed, 3, "h100,8,1,0.3,0.003")
    assert load_error(profiles_copy) == (
        f"{seed}:3: gpu_type: expected one of dgx, quad, rtx, t4, v100 "
        f"({profiles_copy / 'gpu_types.csv'}), got 'h100'"
    )


def test_batch_above_the_types_limit(profiles_copy: Path) -> None:
    app = profiles_copy / "cifar10"
    set_line(app / "seed.csv", 17, "rtx,2048,1,0.6,0.0003")
    assert load_error(profiles_copy) == (
        f"{app / 'seed.csv'}:17: local_bsz: expected at most 1024 (max_local_bsz of rtx, "
        f"{app / 'max_local_bsz.csv'}:3), got 2048"
    )


def test_sync_time_not_below_step_time(profiles_copy: Path) -> None:
    seed = profiles_copy / "cifar10" / "seed.csv"
    set_line(seed, 2, "dgx,32,1,0.03,0.05")
    assert load_error(profiles_copy) == (
        f"{seed}:2: sync_time: expected less than step_time (0.03), got 0.05"
    )


def test_non_integer_batch_and_bad_placement(profiles_copy: Path) -> None:
    seed = profiles_copy / "cifar10" / "seed.csv"
    set_line(seed, 2, "dgx,32.5,1,0.03,0.0005")
    assert (
        load_error(profiles_copy) == f"{seed}:2: local_bsz: expected a positive integer, got '32.5'"
    )
    set_line(seed, 2, "dgx,32,4x,0.03,0.0005")
    assert load_error(profiles_copy) == (
        f"{seed}:2: placement: expected digits 1-9, one per node (e.g. 44), got '4x'"
    )


def test_wrong_number_of_fields(profiles_copy: Path) -> None:
    seed = profiles_copy / "ncf" / "seed.csv"
    set_line(seed, 4, "dgx,128,1,0.01")
    assert load_error(profiles_copy) == (
        f"{seed}:4: row: expected 5 fields (gpu_type,local_bsz,placement,step_time,sync_time), "
        "got 4: 'dgx,128,1,0.01'"
    )


def test_seed_type_without_a_memory_limit(profiles_copy: Path) -> None:
    app = profiles_copy / "yolov3"
    limits = app / "max_local_bsz.csv"
    lines = [line for line in limits.read_text().splitlines() if not line.startswith("v100")]
    limits.write_text("\n".join(lines) + "\n")
    seed_lines = (app / "seed.csv").read_text().splitlines()
    first_v100 = next(i for i, line in enumerate(seed_lines, 1) if line.startswith("v100"))
    assert load_error(profiles_copy) == (
        f"{app / 'seed.csv'}:{first_v100}: gpu_type: expected a type with a row in {limits}, "
        "got 'v100'"
    )


def test_duplicate_limit_row(profiles_copy: Path) -> None:
    limits = profiles_copy / "cifar10" / "max_local_bsz.csv"
    set_line(limits, 4, "rtx,512,1,0.2,0.0003")
    assert load_error(profiles_copy) == (
        f"{limits}:4: gpu_type: expected one row per type, got 'rtx' again (first on line 3)"
    )


def test_app_yaml_errors(profiles_copy: Path) -> None:
    app_yaml = profiles_copy / "deepspeech2" / "app.yaml"
    original = app_yaml.read_text()
    app_yaml.write_text(original.replace("init_batch_size: 20", "init_batch_size: -20"))
    assert load_error(profiles_copy).startswith(
        f"{app_yaml}:4: init_batch_size: expected a positive"
    )
    app_yaml.write_text(original.replace("init_batch_size: 20", "init_batch_size: 2000"))
    assert load_error(profiles_copy) == (
        f"{app_yaml}:4: init_batch_size: expected min_local_bsz (10) <= init_batch_size <= "
        "max_batch_size (640), got 2000"
    )
    app_yaml.write_text(original + "max_epochs: 80\n")
    assert load_error(profiles_copy) == (
        f"{app_yaml}:9: max_epochs: expected one of init_batch_size, max_batch_size, "
        "min_local_bsz, description, got 'max_epochs'"
    )
    app_yaml.write_text(original.replace("min_local_bsz: 10\n", ""))
    assert load_error(profiles_copy) == (
        f"{app_yaml}: min_local_bsz: expected a positive integer, got nothing (missing)"
    )


def test_missing_file_and_bad_gpu_types(profiles_copy: Path) -> None:
    (profiles_copy / "ncf" / "seed.csv").unlink()
    assert load_error(profiles_copy) == f"{profiles_copy / 'ncf' / 'seed.csv'}: file not found"
    types = profiles_copy / "gpu_types.csv"
    set_line(types, 5, "t4,four,aws,NVIDIA T4")
    assert load_error(profiles_copy) == (
        f"{types}:5: gpus_per_node: expected a positive integer, got 'four'"
    )


def test_a_site_can_add_its_own_type_and_app(profiles_copy: Path) -> None:
    with (profiles_copy / "gpu_types.csv").open("a") as f:
        f.write("h100,8,,NVIDIA H100 80GB\n")
    app = profiles_copy / "mymodel"
    app.mkdir()
    (app / "app.yaml").write_text("init_batch_size: 64\nmax_batch_size: 1024\nmin_local_bsz: 16\n")
    (app / "max_local_bsz.csv").write_text("gpu_type,local_bsz\nh100,256\nt4,64\n")
    (app / "seed.csv").write_text(
        "# profiled on our cluster\ngpu_type,local_bsz,placement,step_time,sync_time\n"
        "h100,64,1,0.05,0.001\nh100,256,1,0.12,0.001\n\nt4,64,1,0.3,0.002\nt4,32,2,0.2,0.05\n"
    )
    profiles = load_profiles(profiles_copy)
    mine = profiles.app("mymodel")
    assert mine.gpu_types == ("h100", "t4")
    assert [p.local_bsz for p in mine.seed["h100"]] == [64, 256]
    assert (mine.seed["t4"][1].nodes, mine.seed["t4"][1].gpus) == (1, 2)


def test_parse_placement() -> None:
    assert parse_placement("1") == (1, 1)
    assert parse_placement("44") == (2, 8)
    assert parse_placement("1244") == (4, 11)
    for bad in ("", "40", "a4"):
        with pytest.raises(ValueError, match="expected digits"):
            parse_placement(bad)


def test_trace_files_with_either_column_layout() -> None:
    placements = read_trace_points(TRACES_DIR / "cifar10" / "placements-rtx.csv")
    assert placements[0].local_bsz == 32 and placements[0].gpus == 1
    assert any(p.nodes == 2 and p.gpus == 16 for p in placements)
    scalability = read_trace_points(TRACES_DIR / "cifar10" / "scalability-aws.csv")
    assert (scalability[0].nodes, scalability[0].gpus, scalability[0].local_bsz) == (6, 6, 32)
