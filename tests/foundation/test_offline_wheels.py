"""bench/offline_wheels.py's choices without a package index: which requirements, which names, which members."""

from __future__ import annotations

import stat
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import offline_wheels  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_run_time_requirements_are_pyprojects_without_torch_and_the_optional_ones_with_rays_train_extra_only():
    pytest.importorskip("tomllib")
    requirements = offline_wheels.run_time_requirements(ROOT / "pyproject.toml")
    names = {offline_wheels.requirement_name(r) for r in requirements}
    assert not names & {"torch", "wandb", "imageio-ffmpeg"}
    assert {"ray", "crafter", "lmdb", "opensimplex", "zstandard", "omegaconf", "gymnasium"} <= names
    (ray,) = [r for r in requirements if offline_wheels.requirement_name(r) == "ray"]
    assert ray.startswith("ray[train]") and "2.60" in ray
    assert "opensimplex<0.4" in requirements  # pins travel as pyproject writes them


def test_names_compare_as_pep_503_does_in_present_lists_and_wheel_files(tmp_path):
    present = tmp_path / "present.txt"
    present.write_text("# the image's packages\nTyping_Extensions==4.1\nruamel.yaml  # a dotted name\n\nPyYAML\n")
    assert offline_wheels.read_present(present) == {"typing-extensions", "ruamel-yaml", "pyyaml"}
    assert offline_wheels.wheel_name(Path("ruamel_yaml-0.19.1-py3-none-any.whl")) == "ruamel-yaml"
    assert offline_wheels.wheel_name(Path("PyYAML-6.0-cp312-cp312-manylinux2014_x86_64.whl")) == "pyyaml"


def _member(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFREG | mode) << 16
    return info


def test_pruning_drops_the_named_folders_and_their_record_lines_and_keeps_executables_executable(tmp_path):
    wheel = tmp_path / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"
    kept = {"ray/__init__.py": 0o644, "ray/core/src/ray/raylet/raylet": 0o755, "ray/train/v2/api.py": 0o644}
    dropped = {"ray/jars/ray_dist.jar": 0o644, "ray/rllib/algorithms/ppo.py": 0o644}
    record = "".join(f"{name},sha256=x,1\n" for name in [*kept, *dropped]) + "ray-2.60.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, mode in {**kept, **dropped}.items():
            archive.writestr(_member(name, mode), b"x" * 1000)
        archive.writestr(_member("ray-2.60.0.dist-info/RECORD", 0o644), record)

    saved = offline_wheels.prune_wheel(wheel, ("ray/jars/", "ray/rllib/"))

    assert saved > 0
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert names == {*kept, "ray-2.60.0.dist-info/RECORD"}
        assert archive.getinfo("ray/core/src/ray/raylet/raylet").external_attr >> 16 & 0o777 == 0o755
        record_lines = archive.read("ray-2.60.0.dist-info/RECORD").decode().splitlines()
    assert [line.split(",")[0] for line in record_lines] == [*kept, "ray-2.60.0.dist-info/RECORD"]
