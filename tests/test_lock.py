"""requirements.lock: pip-compile's pins of requirements.txt (`make lock`), which `make` installs."""

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT


def requirements(path) -> list[Requirement]:
    """The requirement lines of a pip requirements file: no comments, no options."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def locked() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in requirements(ROOT / "requirements.lock")}


def pinned(requirement: Requirement) -> str:
    (specifier,) = requirement.specifier  # exactly one, ==
    assert specifier.operator == "==", requirement
    return specifier.version


def test_the_lock_pins_every_loose_requirement_within_its_range_but_torch():
    lock = locked()
    assert "torch" not in lock  # its build (CPU or a CUDA version) is the user's: the README's lines
    for requirement in requirements(ROOT / "requirements.txt"):
        name = canonicalize_name(requirement.name)
        if name == "torch":
            continue
        assert name in lock, f"requirements.txt's {requirement} is not in requirements.lock: run `make lock`"
        version = pinned(lock[name])
        assert requirement.specifier.contains(version, prereleases=True), (
            f"requirements.lock pins {name}=={version}, outside requirements.txt's {requirement}: run `make lock`")
    assert all(pinned(r) for r in lock.values())


def test_the_environment_is_the_locked_one():
    """What `make` installed is what the lock pins, package for package (those for this platform)."""
    differ = {}
    for name, requirement in locked().items():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != pinned(requirement):
            differ[name] = (installed, pinned(requirement))
    assert differ == {}, f"installed, locked: {differ}; `make clean-venv test` installs the lock afresh"
