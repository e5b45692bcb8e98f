"""Wheels for running craftrl on a machine with no package index (a lent GPU machine), within a size budget.

Resolves craftrl's run-time requirements (pyproject.toml's, less torch) for the target's Python and platform,
drops every distribution the target already holds (``--present``, one name per line, pip-freeze lines accepted),
builds a pure-Python wheel here for any requirement PyPI has only as source (Crafter is one),
and trims Ray's wheel of what a training run never loads (its Java jar, the dashboard's web client, RLlib, Serve,
Ray LLM): 79 MB -> ~42 MB for Ray 2.60, which is what lets the bundle travel within a 64 MiB working tree.

    python bench/offline_wheels.py --out .whl --present bench/gpu_image_packages.txt
    # on the target, from the repository root:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD

Left out on purpose: wandb (imported only when ``logger_config.project`` is set) and imageio-ffmpeg (only for
videos, ``record_video_interval``); Ray's ``default`` extra (dashboard, metrics exporters, runtime-env tools),
which a run with ``include_dashboard`` off does not start. The last line is the bundle's size in MiB.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
NOT_AT_RUN_TIME = {"torch", "wandb", "imageio-ffmpeg"}
RAY_EXTRAS = "[train]"
RAY_UNUSED = ("ray/jars/", "ray/dashboard/client/build/", "ray/rllib/", "ray/serve/", "ray/llm/")


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``Foo_bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return normalise(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def wheel_name(path: Path) -> str:
    """The distribution a wheel file holds (its file name up to the first dash)."""
    return normalise(path.name.split("-")[0])


def run_time_requirements(pyproject: Path) -> list[str]:
    """pyproject's dependencies a training run imports, Ray with only the extras training needs."""
    import tomllib  # Python 3.11+

    requirements = []
    for requirement in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        name = requirement_name(requirement)
        if name in NOT_AT_RUN_TIME:
            continue
        if name == "ray":
            requirement = re.sub(r"\[[^\]]*\]", RAY_EXTRAS, requirement)
        requirements.append(requirement)
    return requirements


def read_present(path: Path) -> set[str]:
    """Names from a file of one distribution per line (``name``, ``name==1.2``; ``#`` starts a comment)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(requirement_name(line))
    return names


def prune_wheel(wheel: Path, unused_prefixes: tuple[str, ...]) -> int:
    """Rewrites ``wheel`` without the members under ``unused_prefixes`` (and their RECORD lines); returns bytes saved.

    File modes travel in each member's ``external_attr``, so Ray's executables stay executable.
    """
    before = wheel.stat().st_size
    trimmed = wheel.with_suffix(".trimmed")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as target:
        for member in source.infolist():
            if member.filename.startswith(unused_prefixes):
                continue
            data = source.read(member)
            if member.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if not line.startswith(unused_prefixes)).encode()
            target.writestr(member, data, compress_type=zipfile.ZIP_DEFLATED)
    trimmed.replace(wheel)
    return before - wheel.stat().st_size


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def download(requirements: list[str], python_version: str, out: Path, built: Path) -> None:
    """Binary wheels for the target, with their dependencies, into ``out``. A requirement PyPI has only as source is
    built here as a pure-Python wheel into ``built``, which the resolver is offered through --find-links (pip copies
    what it takes from there into ``out``), and the resolution retried."""
    target = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
              *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]
    for _ in range(8):
        result = _pip("download", *target, "--find-links", str(built), "-d", str(out), *requirements)
        if result.returncode == 0:
            return
        missing = re.search(r"No matching distribution found for (\S+)", result.stderr)
        if missing is None:
            raise SystemExit(f"pip download failed:\n{result.stderr[-3000:]}")
        source_only = missing.group(1)
        built_wheel = _pip("wheel", "--no-deps", "-w", str(built), source_only)
        if built_wheel.returncode != 0:
            raise SystemExit(f"{source_only}: no wheel for Python {python_version}, and building one here failed:\n"
                             f"{built_wheel.stderr[-3000:]}")
        print(f"built {source_only} here (PyPI has no wheel of it)")
    raise SystemExit("pip download: gave up after building 8 source-only requirements")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / ".whl", help="folder for the wheels (emptied first)")
    parser.add_argument("--python-version", default="3.12", help="the target's Python, e.g. 3.12")
    parser.add_argument("--present", type=Path, default=None,
                        help="file naming the distributions the target already holds; they are left out")
    parser.add_argument("--budget-mib", type=float, default=56.0,
                        help="fail if the bundle is larger (what travels with the working tree has a limit)")
    args = parser.parse_args()

    present = read_present(args.present) if args.present else set()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        built = Path(scratch) / "built"
        built.mkdir()
        download(run_time_requirements(ROOT / "pyproject.toml"), args.python_version, args.out, built)
    kept = []
    for wheel in sorted(args.out.glob("*.whl")):
        if wheel_name(wheel) in present:
            wheel.unlink()
            continue
        if wheel_name(wheel) == "ray":
            saved = prune_wheel(wheel, RAY_UNUSED)
            print(f"{wheel.name}: {saved / 2**20:.1f} MiB of unused members removed")
        kept.append(wheel)
    total = sum(wheel.stat().st_size for wheel in kept) / 2**20
    for wheel in kept:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    if total > args.budget_mib:
        raise SystemExit(f"--budget-mib: the bundle is {total:.1f} MiB, over the {args.budget_mib:g} MiB asked")
    print(f"bundle_mib={total:.1f} ({len(kept)} wheels in {args.out})")


if __name__ == "__main__":
    main()
