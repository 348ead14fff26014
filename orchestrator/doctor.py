"""`carc doctor`: is this machine ready to run a grid? Each check says how to fix what is missing."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import docker
import docker.errors
import httpx

from harness_adapters.registry import image_recipes
from proxy.host import CA_CERT_FILE, default_confdir
from sandboxes.images import REGISTRY_BASE, ImageBuildError, offline_base_tag, render
from sandboxes.networks import NoGatewayError, host_address


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def check_engine() -> tuple[Check, docker.DockerClient | None]:
    try:
        client = docker.from_env(timeout=10)
        info = client.info()
    except docker.errors.DockerException as exc:
        return Check("docker engine", False, f"no engine answers: {str(exc)[:120]}",
                     "run scripts/docker-up.sh (installs docker.io, starts dockerd)"), None
    return Check("docker engine", True, f"Docker {info.get('ServerVersion')}, "
                 f"{info.get('Driver')}, {info.get('NCPU')} cpus"), client


def check_host_address(client: docker.DockerClient) -> Check:
    """The address harness proxies reach the host's model server on (see sandboxes/networks.py)."""
    try:
        return Check("host address", True, f"{host_address(client)} (default bridge gateway)")
    except (NoGatewayError, docker.errors.DockerException) as exc:
        return Check("host address", False, str(exc)[:300],
                     "restart dockerd (scripts/docker-up.sh) so the default bridge has an IPv4 subnet")


def check_debootstrap() -> Check:
    found = shutil.which("debootstrap")
    return Check("debootstrap", bool(found), found or "not installed",
                 "" if found else "apt-get install -y debootstrap (needed for the offline base)")


def check_state_quota() -> Check:
    from sandboxes.state_volumes import STATE_IMAGES, quota_unavailable
    reason = quota_unavailable()
    return Check("state quota", reason is None,
                 f"ext4 loop volumes in {STATE_IMAGES}" if reason is None else reason,
                 "" if reason is None else "run carc as root with util-linux and e2fsprogs, or a harness "
                                           "can fill the engine's disk (grid limits.state_mb is then not enforced)")


def check_images(client: docker.DockerClient) -> list[Check]:
    """Whether the current recipe of each image is built (nothing is built here)."""
    def exists(tag: str) -> bool:
        try:
            client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    bases = [t for t in (REGISTRY_BASE, offline_base_tag()) if exists(t)]
    if not bases:
        return [Check("image base", False, f"neither {REGISTRY_BASE} nor {offline_base_tag()} exists",
                      "carc images build --offline (about a minute)")]
    checks = [Check("image base", True, bases[0])]
    tags = {None: bases[0]}
    for name, recipe in image_recipes().items():
        if isinstance(recipe, Exception):
            checks.append(Check(f"image {name}", False, f"its adapter does not load: {str(recipe)[:160]}",
                                f"fix harness_adapters' module for {name}"))
            continue
        parent = tags.get(recipe.parent)
        if parent is None:
            checks.append(Check(f"image {name}", False, f"its parent {recipe.parent} is not built",
                                f"carc images build {name}"))
            continue
        try:
            tag = f"carc-{name}:{render(recipe, parent).digest()}"
        except ImageBuildError as exc:
            checks.append(Check(f"image {name}", False, str(exc)[:200], f"carc images build {name}"))
            continue
        built = exists(tag)
        tags[name] = tag if built else None
        checks.append(Check(f"image {name}", built, tag if built else f"{tag} not built",
                            "" if built else f"carc images build {name}"))
    return checks


def check_proxy_ca() -> Check:
    ca = default_confdir() / CA_CERT_FILE
    if ca.exists():
        return Check("proxy CA", True, str(ca))
    return Check("proxy CA", False, f"{ca} not made yet",
                 "it is made by the first proxy start (any `carc grid run`)")


def check_mitmproxy() -> Check:
    from proxy.host import MITMPROXY_VERSION, mitmproxy_venv
    mitmdump = mitmproxy_venv() / "bin" / "mitmdump"
    if mitmdump.exists():
        return Check("host mitmproxy", True, f"{mitmdump} ({MITMPROXY_VERSION})")
    return Check("host mitmproxy", False, f"{mitmdump} missing",
                 "made on first use; needs pip to reach PyPI")


def check_endpoint(url: str | None) -> Check:
    if url is None:
        try:
            import solver_model.search  # noqa: F401
        except ImportError as exc:
            return Check("model endpoint", False, f"embedded solver model: {exc}",
                         "pip install -e . in the project")
        return Check("model endpoint", True, "embedded solver model (started per run)")
    try:
        status = httpx.get(url.rstrip("/") + "/models", timeout=5).status_code
    except httpx.HTTPError as exc:
        return Check("model endpoint", False, f"{url}: {exc}", "check the grid's model.endpoint")
    return Check("model endpoint", status < 500, f"{url}/models answered {status}",
                 "" if status < 500 else "check the endpoint")


def run_checks(endpoint: str | None = None) -> list[Check]:
    engine, client = check_engine()
    checks = [engine, check_debootstrap(), check_state_quota()]
    if client is not None:
        checks += [check_host_address(client), *check_images(client)]
    checks += [check_mitmproxy(), check_proxy_ca(), check_endpoint(endpoint)]
    return checks
