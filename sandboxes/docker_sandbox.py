"""A cell's Docker sandbox: internal network, journaling proxy container, state volume, limits.

Layout of one cell (every object labelled `org.carc.run` / `org.carc.cell` so a crash's leftovers
can be found and pruned):

    sandbox container --(internal network, no host address on the bridge)--> proxy container
    proxy container   --(carc-egress bridge)--> the model host(s) only

Names: Docker's resolver in the sandbox answers the cell network's own names (`proxy`) and
forwards every other lookup to the proxy's DNS mode, which refuses it (NXDOMAIN) at once and
journals it; so no lookup leaves, and none waits out a resolver timeout.

The sandbox runs as uid 1000 on a read-only root filesystem with the state volume at /state and a
tmpfs at /tmp, no capabilities, no-new-privileges, cpu/memory/pids limits and no Docker socket.
Its idle keeper process runs as uid 1001, so a wipe (`kill -9 -1` as uid 1000) stops every harness
process but not the container. The real API key is only in the proxy container's environment.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import select
import socket
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import requests.exceptions
import structlog
from docker.types import Mount
from docker.utils.socket import STDERR, frames_iter

from proxy.host import CA_CERT_FILE, CONTROL_FILE, PLACEHOLDER_KEY, addon_options, default_confdir, set_arguments
from proxy.journal import settle_in_flight
from sandboxes.engines import SandboxEngine, register_engine
from sandboxes.environment import (SNAPSHOT_GZIP_LEVEL, ExecResult, LeftOut, Limits, ProxySpec,  # noqa: F401 - the specs, re-exported
                                  SandboxEnvironment, SandboxError, SandboxSpec, durable_replace)
from sandboxes.images import docker_client
from sandboxes.snapshot_archive import SnapshotArchive
from sandboxes import state_volumes
from sandboxes.networks import create_cell_network, ensure_egress_network, host_address, pinned_address, remove_network

log = structlog.get_logger("carc.sandbox")

SANDBOX_USER = "1000:1000"
# how long past its in-container `timeout` the host waits on an exec's stream before it cuts it
# (the in-container `timeout` can be stopped by the harness: `kill -STOP -1` as the same uid)
EXEC_BACKSTOP_S = 30.0
# how often a wait on a sandbox process (a harness's turn) asks whether the cell's proxy container
# still runs: a harness whose model connection died retries on its own (hermes: 3 retries over
# about 70 s) before it answers, and the instance is rerun anyway
PROXY_CHECK_S = 3.0
KEEPER_USER = "1001:1001"
CA_PATH = "/tmp/carc/ca.pem"
PROXY_HOST = "proxy"
REGULAR_PORT = 8080
REVERSE_PORT = 8081
DNS_PORT = 53  # the engine forwards lookups to port 53 only
LABEL_RUN = "org.carc.run"
LABEL_CELL = "org.carc.cell"
LABEL_ROLE = "org.carc.role"
# The Ray node whose cell attempt made the object (the Ray executor sets NODE_ENV in the attempt's
# process): what `prune_dead_nodes` finds when a node that was lost comes back.
LABEL_NODE = "org.carc.ray-node"
NODE_ENV = "CARC_RAY_NODE"
# Paths at least this long are listed before a snapshot: the engine's archive silently drops a
# path whose host-side name passes PATH_MAX (4096), and the volume's host prefix takes ~100 of it.
LONG_PATH = 3000


def slug(run: str, cell: str) -> str:
    """A short name unique to (run, cell) that Docker accepts."""
    digest = hashlib.sha256(f"{run}\0{cell}".encode()).hexdigest()[:10]
    clean = re.sub(r"[^a-zA-Z0-9_.-]", "-", cell)[:40]
    return f"carc-{digest}-{clean}"


class DockerSandbox(SandboxEnvironment):
    """One cell's sandbox (and its proxy); `start()` makes it, `teardown()` removes it."""

    def __init__(self, spec: SandboxSpec, client: docker.DockerClient | None = None):
        self.spec = spec
        self.client = client or docker_client()
        self.name = slug(spec.run, spec.cell)
        self.labels = {LABEL_RUN: spec.run, LABEL_CELL: spec.cell}
        if os.environ.get(NODE_ENV):
            self.labels[LABEL_NODE] = os.environ[NODE_ENV]
        self.container = None
        self.proxy_container = None
        self.proxy_address: str | None = None  # the proxy on the cell network: the sandbox's DNS
        self.network = None
        self.volume = None
        self.generation = 0  # 0: the cell's own sandbox; n > 0: a standby made by `standby(n)`

    def standby(self, generation: int) -> "DockerSandbox":
        """Another sandbox container of this cell, started, with its own empty state volume, on
        the same cell network behind the same proxy. Its teardown removes its container and
        volume only; the cell's own teardown (and `prune`) removes any left."""
        other = DockerSandbox(self.spec, docker_client())  # a client of its own: used from a thread
        other.generation = generation
        other.proxy_container, other.proxy_address, other.network = (
            self.proxy_container, self.proxy_address, self.network)
        return other.start()

    def retire(self) -> None:
        """Remove this sandbox's container and volume, with an engine client of this thread's own
        (the cell's thread goes on using its client)."""
        self.remove_sandbox(docker_client())

    @property
    def _suffix(self) -> str:
        return f"-{self.generation}" if self.generation else ""

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> "DockerSandbox":
        try:
            self._start()
        except BaseException:
            self.teardown()
            raise
        return self

    def _start(self) -> None:
        spec = self.spec
        if not self.generation:
            self._remove_leftovers()
        mounts = []
        if spec.volume:
            self.volume = state_volumes.create(self.client, f"{self.name}-state{self._suffix}",
                                               {**self.labels, LABEL_ROLE: "state"}, spec.limits.state_bytes)
            mounts.append(Mount(self.state_path, self.volume.name, type="volume"))
        env = {"HOME": self.state_path, "TMPDIR": "/tmp", **spec.env}
        network_mode = "none"
        if spec.proxy is not None:
            if not self.generation:
                self.network = create_cell_network(self.client, self.name, {**self.labels, LABEL_ROLE: "network"})
                self.proxy_container = self._start_proxy(spec.proxy)
            network_mode = self.network.name
            env.update(proxy_environment())
        self.container = self.client.containers.run(
            spec.image, ["sleep", "infinity"], name=f"{self.name}-sandbox{self._suffix}", detach=True,
            init=True, user=KEEPER_USER, read_only=True, network_mode=network_mode,
            mounts=mounts, tmpfs={"/tmp": f"rw,nosuid,nodev,size={spec.limits.tmp_size},mode=1777"},
            security_opt=["no-new-privileges"], cap_drop=["ALL"],
            dns=[self.proxy_address] if self.proxy_address else None,
            nano_cpus=int(spec.limits.cpus * 1e9), mem_limit=spec.limits.memory,
            memswap_limit=spec.limits.memory, pids_limit=spec.limits.pids,
            environment=env, working_dir=self.state_path,
            labels={**self.labels, LABEL_ROLE: "sandbox"}, hostname="sandbox")
        if spec.proxy is not None:
            self._install_ca()

    def _install_ca(self) -> None:
        """The proxy's CA at CA_PATH, written as the keeper: the harness (uid 1000) reads it but
        cannot write beside it, so /tmp/carc, which the wipe keeps, carries nothing from one
        instance to the next."""
        self.write_file(CA_PATH, self.proxy_ca(), user=KEEPER_USER)

    def _start_proxy(self, proxy: ProxySpec):
        proxy.journal_dir.mkdir(parents=True, exist_ok=True)
        (proxy.journal_dir / "proxy.ready").unlink(missing_ok=True)
        ca_dir = proxy.ca_dir or default_confdir()
        env = {}
        if proxy.key_env and os.environ.get(proxy.key_env):
            env[proxy.key_env] = os.environ[proxy.key_env]  # the real key: proxy only
        target = re.match(r"^[a-z]+://[^/]+", proxy.upstream).group(0)  # mitmproxy wants no path
        mounts = [Mount("/journal", str(proxy.journal_dir.resolve()), type="bind"),
                  Mount("/ca", str(ca_dir.resolve()), type="bind")]
        if proxy.prices is not None:
            mounts.append(Mount("/prices.json", str(proxy.prices.resolve()), type="bind", read_only=True))
        options = addon_options(journal_dir="/journal", cell=self.spec.cell, control=f"/journal/{CONTROL_FILE}",
                                confdir="/ca", allow=proxy.allow, key_env=proxy.key_env if env else "",
                                prices="/prices.json" if proxy.prices is not None else None)
        args = ["--mode", f"regular@{REGULAR_PORT}", "--mode", f"reverse:{target}@{REVERSE_PORT}",
                "--mode", f"dns@{DNS_PORT}", *set_arguments(options)]
        if proxy.upstream_ca is not None:
            mounts.append(Mount("/upstream-ca.pem", str(proxy.upstream_ca.resolve()), type="bind",
                                read_only=True))
            args += ["--set", "ssl_verify_upstream_trusted_ca=/upstream-ca.pem"]
        container = self.client.containers.create(
            proxy.image, args, name=f"{self.name}-proxy", detach=True, init=True,
            user=f"{os.getuid()}:{os.getgid()}", read_only=True,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=64m,mode=1777"},
            mounts=mounts,
            security_opt=["no-new-privileges"], cap_drop=["ALL"], environment={"HOME": "/tmp", **env},
            network=ensure_egress_network(self.client),
            extra_hosts={"host.docker.internal": "host-gateway"}, mem_limit="512m",
            pids_limit=256, labels={**self.labels, LABEL_ROLE: "proxy"},
            # port 53 without a capability: only this container's network namespace changes
            sysctls={"net.ipv4.ip_unprivileged_port_start": str(DNS_PORT)})
        self.proxy_container = container  # from here on, a failed start's teardown removes it
        self.proxy_address = pinned_address(self.network)
        self.network.connect(container, aliases=[PROXY_HOST],
                             **({"ipv4_address": self.proxy_address} if self.proxy_address else {}))
        container.start()
        self._wait_proxy(container, ca_dir)
        return container

    def _wait_proxy(self, container, ca_dir: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # The addon writes proxy.ready once loaded (an open port alone is not readiness).
            # Read on the host first: the engine is asked only whether the proxy is still up, and
            # for its logs only when it is not (a full logs() per poll and per starting cell was
            # a cost of start-up bursts with many cells).
            if ((self.spec.proxy.journal_dir / "proxy.ready").exists()
                    and (ca_dir / CA_CERT_FILE).exists()):
                return
            container.reload()
            if container.status == "exited":
                logs = container.logs(tail=200).decode("utf-8", "replace")
                raise SandboxError(f"{container.name}: the proxy exited:\n{logs[-2000:]}")
            time.sleep(0.1)
        raise SandboxError(f"{container.name}: the proxy did not start listening in 60 s:\n"
                           f"{container.logs().decode('utf-8', 'replace')[-2000:]}")

    def proxy_ca(self) -> bytes:
        proxy = self.spec.proxy
        ca_dir = proxy.ca_dir or default_confdir()
        return (ca_dir / CA_CERT_FILE).read_bytes()

    def reverse_base_url(self) -> str:
        """The model base URL a harness inside the sandbox uses (the proxy's reverse mode)."""
        path = re.sub(r"^[a-z]+://[^/]+", "", self.spec.proxy.upstream) if self.spec.proxy else ""
        return f"http://{PROXY_HOST}:{REVERSE_PORT}{path}"

    def _remove_leftovers(self) -> None:
        """A crashed earlier attempt of this cell may have left objects with our names."""
        for suffix in ("-sandbox", "-proxy"):
            try:
                self.client.containers.get(self.name + suffix).remove(force=True)
            except docker.errors.NotFound:
                pass
        for net in self.client.networks.list(names=[f"{self.name}-net"]):
            remove_network(net)
        try:
            state_volumes.remove(self.client.volumes.get(f"{self.name}-state"))
        except docker.errors.NotFound:
            pass
        self._remove_standbys()

    def _remove_standbys(self) -> None:
        """Every standby sandbox of this cell (`standby(n)`) and its volume, by their labels."""
        labels = [f"{LABEL_RUN}={self.spec.run}", f"{LABEL_CELL}={self.spec.cell}"]
        for container in self.client.containers.list(all=True, ignore_removed=True,
                                                     filters={"label": labels + [f"{LABEL_ROLE}=sandbox"]}):
            if container.name.startswith(f"{self.name}-sandbox-"):
                try:
                    container.remove(force=True)
                except docker.errors.NotFound:
                    pass
        for volume in self.client.volumes.list(filters={"label": labels + [f"{LABEL_ROLE}=state"]}):
            if volume.name.startswith(f"{self.name}-state-"):
                try:
                    state_volumes.remove(volume)
                except docker.errors.NotFound:
                    pass

    def fault(self) -> str | None:
        """Why this sandbox cannot serve an instance now (its container or its proxy container
        stopped or vanished, e.g. `docker kill`), or None. Asks the engine, so it is cheap
        enough after a failure or every PROXY_CHECK_S of a wait, not per call."""
        return self._fault(("sandbox", self.container), ("proxy", self.proxy_container))

    def proxy_fault(self) -> str | None:
        """Why the cell's proxy container cannot serve now (stopped or gone), or None: no proxy,
        or an engine that does not answer this once. A wait goes on through an engine hiccup:
        ending the turn on one would charge it as the learner's failure when the slot driver's
        own check finds the engine well again."""
        try:
            return self._fault(("proxy", self.proxy_container), engine_errors=False)
        except requests.exceptions.RequestException:  # the engine's socket itself
            return None

    @staticmethod
    def _fault(*containers, engine_errors: bool = True) -> str | None:
        for role, container in containers:
            if container is None:
                continue
            try:
                container.reload()
            except docker.errors.NotFound:
                return f"the {role} container {container.name} is gone"
            except docker.errors.APIError as exc:
                if not engine_errors:
                    continue
                return f"the Docker engine does not answer for the {role} container {container.name}: {exc}"
            if container.status != "running":
                state = container.attrs.get("State") or {}
                return (f"the {role} container {container.name} is {container.status} "
                        f"(exit code {state.get('ExitCode')}, OOM killed: {state.get('OOMKilled')})")
        return None

    def teardown(self) -> None:
        """Remove the sandbox; the cell's own (generation 0) also removes its proxy, its network
        and every standby of the cell still standing."""
        self.remove_sandbox()
        if self.generation:  # a standby: the cell's proxy and network are the cell's own
            self.proxy_container = self.network = None
            return
        if self.proxy_container is not None:
            try:
                self.proxy_container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("teardown_container", name=self.proxy_container.name, error=str(exc))
        self.proxy_container = None
        if self.spec.proxy is not None:  # the calls a killed proxy left unjournaled
            try:
                settle_in_flight(self.spec.proxy.journal_dir)
            except (OSError, ValueError) as exc:
                log.warning("teardown_in_flight", sandbox=self.name, error=str(exc))
        if self.spec.volume:
            try:
                self._remove_standbys()  # those a killed thread or a failed swap left
            except docker.errors.APIError as exc:
                log.warning("teardown_standbys", sandbox=self.name, error=str(exc))
        if self.network is not None:
            remove_network(self.network)
            self.network = None

    def remove_sandbox(self, client: docker.DockerClient | None = None) -> None:
        """Remove the sandbox container and its state volume only (a standby's or a retired
        sandbox's end: the cell's proxy and network serve its other sandbox). `client`: the
        engine client to do it with (from another thread than the one using this sandbox's)."""
        if client is not None:
            if self.container is not None:
                self.container = client.containers.get(self.container.id)
            if self.volume is not None:
                self.volume = client.volumes.get(self.volume.name)
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("teardown_container", name=self.container.name, error=str(exc))
        self.container = None
        if self.volume is not None:
            try:
                state_volumes.remove(self.volume)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                log.warning("teardown_volume", name=self.volume.name, error=str(exc))
            self.volume = None

    # --- commands and files -----------------------------------------------------------------

    def exec(self, cmd: list[str], input: bytes | str | None = None, cwd: str | None = None,
             env: dict[str, str] | None = None, timeout: float | None = None,
             user: str | None = None) -> ExecResult:
        user = user or SANDBOX_USER
        if self.container is None:
            raise SandboxError(f"{self.name}: exec before start() or after teardown()")
        # `timeout` inside the container kills the whole process group, not just the client side.
        wrapped = ["timeout", "-s", "KILL", f"{timeout:.3f}", *cmd] if timeout else cmd
        api = self.client.api
        try:
            exec_id = api.exec_create(self.container.id, wrapped, stdin=True, stdout=True,
                                      stderr=True, environment=env, workdir=cwd, user=user)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise SandboxError(f"{self.name}: cannot run {cmd[:3]}: {exc}") from None
        raw = getattr(sock, "_sock", sock)
        raw.settimeout((timeout or 3600) + EXEC_BACKSTOP_S)
        data = input.encode() if isinstance(input, str) else (input or b"")

        def feed() -> None:
            try:
                if data:
                    raw.sendall(data)
                raw.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the process exited without reading all of its input

        started = time.monotonic()
        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        # Frames collected in lists and joined once (docker-py's consume_socket_output
        # concatenates per frame: quadratic in the output).
        out: list[bytes] = []
        err: list[bytes] = []
        cut = False
        try:
            # The host's own backstop, past the in-container `timeout` (which a harness can
            # stop: `kill -STOP -1` as the same uid stops it too).
            for stream_id, frame in _frames(raw, started + (timeout or 3600) + EXEC_BACKSTOP_S,
                                            proxy_fault=self.proxy_fault):
                (err if stream_id == STDERR else out).append(frame)
        except (socket.timeout, TimeoutError):
            err.append(b"(no answer from the docker exec stream)")
            cut = True
        finally:
            sock.close()
        stdout, stderr = b"".join(out), b"".join(err)
        writer.join(5)
        code = api.exec_inspect(exec_id).get("ExitCode")
        code = -1 if code is None else code
        # 137 is also a kill for other reasons (CPU or memory limit); only a full wait is a timeout.
        timed_out = cut or (bool(timeout) and code in (124, 137) and time.monotonic() - started >= timeout * 0.98)
        return ExecResult(code, stdout or b"", stderr or b"", timed_out)

    def open_process(self, cmd: list[str], env: dict[str, str] | None = None,
                     user: str | None = None) -> "SandboxProcess":
        """A long-lived process with a line protocol on stdin/stdout (a harness driver)."""
        user = user or SANDBOX_USER
        if self.container is None:
            raise SandboxError(f"{self.name}: open_process before start() or after teardown()")
        api = self.client.api
        exec_id = api.exec_create(self.container.id, cmd, stdin=True, stdout=True, stderr=True,
                                  environment=env, user=user)["Id"]
        sock = api.exec_start(exec_id, socket=True)
        return SandboxProcess(self, exec_id, sock)

    def read_file(self, path: str) -> bytes:
        result = self.exec(["cat", "--", path], timeout=60)
        if not result.ok:
            raise FileNotFoundError(f"{self.name}:{path}: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def write_file(self, path: str, data: bytes | str, user: str | None = None) -> None:
        result = self.exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "sh", path],
                           input=data, timeout=60, user=user)
        if not result.ok:
            raise SandboxError(f"{self.name}:{path}: cannot write: "
                               f"{result.stderr.decode(errors='replace').strip()}")

    # --- the state volume -------------------------------------------------------------------

    def wipe(self) -> None:
        # kill -9 -1 as uid 1000 reaches every harness process, not the keeper (uid 1001), and not
        # this shell; so no `timeout` wrapper, which the kill would take down with the rest.
        # Everything in the volume is uid 1000's own (the harness has no other uid), so the modes
        # it set (a chmod 555 folder, a chmod 000 file) are undone first, then everything goes.
        script = (f"kill -9 -1 2>/dev/null; chmod -R u+rwX {self.state_path} 2>/dev/null; "
                  f"find {self.state_path} -mindepth 1 -delete; "
                  "find /tmp -mindepth 1 -maxdepth 1 ! -name carc -exec rm -rf {} +; "
                  f"[ -z \"$(ls -A {self.state_path})\" ]")
        try:
            result = self.exec(["sh", "-c", script])
            failure = None if result.ok else result.stderr.decode(errors="replace")[-500:]
        except SandboxError as exc:  # no process can start: the harness filled the pids limit
            failure = str(exc)
        if failure is not None:
            # A process killed mid-write may have added a file after the delete, or nothing can
            # start: a restart ends every process in the container (and empties its tmpfs), then
            # the wipe runs again on a container that is as it was started.
            log.warning("wipe_retry_after_restart", sandbox=self.name, error=failure)
            self._restart()
            result = self.exec(["sh", "-c", script])
            if not result.ok:
                raise SandboxError(f"{self.name}: wipe left files in {self.state_path}: "
                                   f"{result.stderr.decode(errors='replace')[-500:]}")

    def end_processes(self) -> None:
        """End every harness process (uid 1000: a hung or stopped driver, a fork bomb, whatever a
        failed instance left running) and leave the volume as it is. When nothing can start (the
        pids limit is full) the container is restarted, which ends them all."""
        try:
            if self.exec(["sh", "-c", "kill -9 -1 2>/dev/null; true"]).ok:
                return
        except SandboxError:
            pass
        log.warning("end_processes_by_restart", sandbox=self.name)
        self._restart()

    def _restart(self) -> None:
        try:
            self.container.restart(timeout=0)
        except docker.errors.APIError as exc:
            raise SandboxError(f"{self.name}: the container could not be restarted for a wipe: {exc}") from None
        if self.spec.proxy is not None:
            self._install_ca()

    def snapshot(self, dest: Path) -> list[LeftOut]:
        """The state volume as `dest` (tar.gz of `./...`), read through the engine's archive API:
        as the engine, so no mode the harness set (chmod 000) and no process filling the pids
        limit stops it; streamed to disk, so memory stays flat; and bounded - file content past
        `limits.snapshot_bytes` is left out, and a snapshot taking longer than `limits.snapshot_s`
        fails with the reason. Returns what was left out (by the cap, or a path too long for the
        engine to read), for the cell's records; the archive itself holds only the harness's files.
        A file keeps its holes (`sandboxes/snapshot_archive.py`): the cap counts the data a file
        stores, not its apparent size, and a restore gives back a sparse file as sparse.

        A harness's own processes (a gateway, a daemon) may be writing a database right now:
        they are frozen (SIGSTOP, every uid-1000 process) while the engine reads, so the archive
        is one point in time, as after a crash (SQLite's WAL recovers from that)."""
        if self.container is None:
            raise SandboxError(f"{self.name}: snapshot before start() or after teardown()")
        # In the same exec as the freeze: the paths the engine's archive may drop without a word.
        frozen, long_paths = self._signal_harness(
            "STOP", f"find {self.state_path} -mindepth 1 -regextype posix-extended "
                    f"-regex '.{{{LONG_PATH},}}' -print0 2>/dev/null | head -c 4000000")
        prefix = self.state_path + "/"
        watched = {"./" + raw.decode("utf-8", "surrogateescape").removeprefix(prefix) for raw in long_paths}
        try:
            left_out = self._archive_state(dest, watched)
        finally:
            if frozen:
                self._signal_harness("CONT")
        if left_out:
            log.warning("snapshot_left_out", sandbox=self.name, files=len(left_out))
        return left_out

    def _signal_harness(self, signal_name: str, then: str = "true") -> tuple[bool, list[bytes]]:
        """Signal every harness process, then run `then` (its stdout split on NUL)."""
        try:
            # No `timeout` wrapper: it runs as uid 1000 too, and `kill -STOP -1` would stop it.
            result = self.exec(["sh", "-c", f"kill -{signal_name} -1 2>/dev/null; {then}"])
        except SandboxError as exc:  # e.g. no process can start (pids limit): read unfrozen
            log.warning("snapshot_signal_failed", sandbox=self.name, signal=signal_name, error=str(exc))
            return False, []
        return result.ok, [p for p in result.stdout.split(b"\0") if p]

    def _archive_state(self, dest: Path, watched: set[str]) -> list[LeftOut]:
        """Stream the volume into `dest`; what the cap left out, and those `watched` paths (in
        archive form, `./...`) the engine did not hand over."""
        limits = self.spec.limits
        started = time.monotonic()
        try:
            stream, _ = self.container.get_archive(self.state_path + "/.", chunk_size=1 << 20)
        except docker.errors.APIError as exc:
            raise SandboxError(f"{self.name}: snapshot of {self.state_path} failed: {exc}") from None
        kept, left_out = 0, []
        tmp = dest.with_suffix(".tmp")
        source = _ChunkReader(stream, deadline=started + limits.snapshot_s)
        try:
            with (tarfile.open(fileobj=source, mode="r|") as archive,
                  tarfile.open(tmp, "w:gz", compresslevel=SNAPSHOT_GZIP_LEVEL) as out):
                writer = SnapshotArchive(out, dest.parent)
                for member in archive:
                    member.name = _relative_member(member.name)
                    if member.name is None:
                        continue
                    watched.discard(member.name)
                    if not member.isfile():
                        writer.add(member)
                        continue
                    # The cap binds a file's data (the blocks it holds), not its apparent size:
                    # a sparse file costs the snapshot only what it stores.
                    stored = writer.add(member, archive.extractfile(member), limits.snapshot_bytes - kept)
                    if not stored.written:
                        left_out.append(LeftOut(member.name, stored.data, (
                            f"its data ({stored.data} bytes; apparent size {stored.apparent}) is over what "
                            f"is left of the snapshot cap of {limits.snapshot_bytes} bytes of file data "
                            f"(grid limits.snapshot_mb)")))
                        continue
                    kept += stored.data
        except (tarfile.TarError, OSError, TimeoutError, docker.errors.APIError) as exc:
            tmp.unlink(missing_ok=True)
            raise SandboxError(f"{self.name}: snapshot of {self.state_path} failed after "
                               f"{time.monotonic() - started:.0f} s: {exc}") from None
        durable_replace(tmp, dest)
        return left_out + [LeftOut(name, None, "path longer than the engine's archive reads (PATH_MAX)")
                           for name in sorted(watched)]

    def restore(self, source: Path | None) -> None:
        self.wipe()
        if source is None:
            return
        result = self.exec(["tar", "-C", self.state_path, "-xzf", "-"],
                           input=source.read_bytes(), timeout=600)
        if not result.ok:
            raise SandboxError(f"{self.name}: restoring {source} failed: "
                               f"{result.stderr.decode(errors='replace')[-500:]}")


class ProxyDown(SandboxError):
    """A wait on a sandbox process ended because the cell's proxy container stopped: the process
    may be retrying a model connection that is gone (the slot driver finds the fault and reruns
    the instance, uncharged)."""


class LineTooLong(ValueError):
    """A process's output line passed the reader's limit."""


class SandboxProcess:
    """stdin/stdout lines of a process inside a sandbox; stderr is kept for error messages."""

    def __init__(self, sandbox: DockerSandbox, exec_id: str, sock):
        self.sandbox = sandbox
        self.exec_id = exec_id
        self.sock = sock
        self.raw = getattr(sock, "_sock", sock)
        self.frames = frames_iter(self.raw, tty=False)
        self.buffer = bytearray()  # appended in place: a long line costs linear time
        self.stderr = b""

    def send_line(self, text: str, timeout: float | None = None) -> None:
        """Write one line to the process's stdin; with `timeout`, TimeoutError (socket.timeout)
        when the process does not take it in that time (stopped, not reading)."""
        if timeout is not None:
            self.raw.settimeout(timeout)
        self.raw.sendall(text.encode() + b"\n")

    def read_line(self, timeout: float, limit: int | None = None) -> str | None:
        """The next stdout line, or None when the process ended; TimeoutError past `timeout`;
        with `limit`, LineTooLong when the line passes `limit` bytes (what was read of it is
        dropped).

        docker-py's frame reader polls the socket with no timeout of its own, so a process that
        says nothing (hung, stopped) would hold it forever: each frame is waited for here."""
        self.raw.settimeout(timeout)
        frames = _frames(self.raw, time.monotonic() + timeout, self.frames, self.sandbox.proxy_fault)
        end = self.buffer.find(b"\n")
        while end < 0:
            if limit is not None and len(self.buffer) > limit:
                self.buffer = bytearray()
                raise LineTooLong(f"{self.sandbox.name}: a line of more than {limit} bytes")
            try:
                stream, data = next(frames)
            except StopIteration:
                return None
            except (socket.timeout, TimeoutError):
                raise TimeoutError(f"{self.sandbox.name}: no answer in {timeout:g} s") from None
            if stream == 1:
                newline = data.find(b"\n")  # only the new bytes are searched: linear in the line
                if newline >= 0:
                    end = len(self.buffer) + newline
                self.buffer += data
            else:
                self.stderr = (self.stderr + data)[-20000:]
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        return line.decode("utf-8", "replace")

    def exit_code(self) -> int | None:
        """The process's exit code once it ended (None while it runs)."""
        try:
            return self.sandbox.client.api.exec_inspect(self.exec_id).get("ExitCode")
        except docker.errors.APIError:
            return None

    def close(self, timeout: float = 900) -> int | None:
        """Close stdin, drain until the process exits (or `timeout`; 0: no wait); its exit code."""
        try:
            self.raw.shutdown(socket.SHUT_WR)
            while timeout > 0 and self.read_line(timeout) is not None:
                pass
        except (OSError, TimeoutError, ProxyDown):  # the drain is best effort
            pass
        finally:
            self.sock.close()
            # The socket itself, too (the wrapper's close leaves it open while this object holds
            # it): an exec whose output nobody reads any more would stall the engine's stream
            # copy, and with it every later exec and `docker top` of the container.
            self.raw.close()
        return self.sandbox.client.api.exec_inspect(self.exec_id).get("ExitCode")


def proxy_environment() -> dict[str, str]:
    """What a process in the sandbox needs to go through the proxy and trust its CA."""
    proxy_url = f"http://{PROXY_HOST}:{REGULAR_PORT}"
    env = {"HTTP_PROXY": proxy_url, "HTTPS_PROXY": proxy_url, "http_proxy": proxy_url,
           "https_proxy": proxy_url, "NO_PROXY": f"localhost,127.0.0.1,{PROXY_HOST}",
           "no_proxy": f"localhost,127.0.0.1,{PROXY_HOST}",
           "OPENAI_API_KEY": PLACEHOLDER_KEY, "ANTHROPIC_API_KEY": PLACEHOLDER_KEY}
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "CURL_CA_BUNDLE",
                 "PIP_CERT"):
        env[name] = CA_PATH
    return env


# --- cleaning up after crashes --------------------------------------------------------------

@dataclass
class Pruned:
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def __iadd__(self, other: "Pruned") -> "Pruned":
        self.containers += other.containers
        self.networks += other.networks
        self.volumes += other.volumes
        return self


def prune(client: docker.DockerClient | None = None, run: str | None = None) -> Pruned:
    """Remove every carc container, network and volume (of one run, or of all runs)."""
    return _prune_labelled(client or docker_client(), f"{LABEL_RUN}={run}" if run else LABEL_RUN)


def prune_dead_nodes(alive: set[str], client: docker.DockerClient | None = None) -> Pruned:
    """Remove what cell attempts of Ray nodes not in `alive` left on this engine: a node that was
    lost mid-run and came back (its raylet, and so its node id, is new) keeps its old attempt's
    objects until then. Objects of the local pool carry no node label and are never touched."""
    client = client or docker_client()
    pruned = Pruned()
    dead = set()
    for lister in (client.containers.list(all=True, filters={"label": LABEL_NODE}, ignore_removed=True),
                   client.networks.list(filters={"label": LABEL_NODE}),
                   client.volumes.list(filters={"label": LABEL_NODE})):
        for obj in lister:
            # a container's labels are under Config; a network's and a volume's at the top
            labels = obj.attrs.get("Labels") or (obj.attrs.get("Config") or {}).get("Labels") or {}
            node = labels.get(LABEL_NODE)
            if node and node not in alive:
                dead.add(node)
    for node in sorted(dead):
        pruned += _prune_labelled(client, f"{LABEL_NODE}={node}")
    return pruned


def _prune_labelled(client: docker.DockerClient, label: str) -> Pruned:
    pruned = Pruned()
    # Other teardowns run meanwhile: whatever they remove first is not an error here.
    for container in client.containers.list(all=True, filters={"label": label}, ignore_removed=True):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        pruned.containers.append(container.name)
    for net in client.networks.list(filters={"label": label}):
        remove_network(net)
        pruned.networks.append(net.name)
    for volume in client.volumes.list(filters={"label": label}):
        try:
            state_volumes.remove(volume)
            pruned.volumes.append(volume.name)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as exc:
            log.warning("prune_volume", name=volume.name, error=str(exc))
    return pruned


class _ChunkReader(io.RawIOBase):
    """The engine's archive stream (an iterator of chunks) as a file, with a deadline."""

    def __init__(self, chunks, deadline: float):
        self.chunks, self.deadline, self.buffer = iter(chunks), deadline, b""

    def readable(self) -> bool:
        return True

    def readinto(self, target) -> int:
        while not self.buffer:
            if time.monotonic() > self.deadline:
                raise TimeoutError("the snapshot took longer than limits.snapshot_s")
            try:
                self.buffer = next(self.chunks)
            except StopIteration:
                return 0
        n = min(len(target), len(self.buffer))
        target[:n], self.buffer = self.buffer[:n], self.buffer[n:]
        return n


def _frames(raw, deadline: float, frames=None, proxy_fault=None):
    """docker-py's (stream, bytes) frames of an exec socket, each waited for until `deadline`
    (TimeoutError past it): its own reader polls the socket with no timeout at all. With
    `proxy_fault`, a wait asks it every PROXY_CHECK_S and raises ProxyDown when it names a fault:
    the process may be waiting on a model connection that is gone."""
    frames = frames if frames is not None else frames_iter(raw, tty=False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer from the docker exec stream")
        wait = left if proxy_fault is None else min(left, PROXY_CHECK_S)
        if not select.select([raw], [], [], wait)[0]:
            if proxy_fault is not None and (fault := proxy_fault()):
                raise ProxyDown(fault)
            continue
        try:
            yield next(frames)
        except StopIteration:
            return


def _relative_member(name: str) -> str | None:
    """An archive member of `<state>/.` (which the engine names `./<path>`) as `./<path>`, the
    snapshot layout; None for the folder itself and for any name that climbs (`..`)."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "./" + "/".join(parts)


@register_engine("docker")
class DockerEngine(SandboxEngine):
    """Harnesses, their proxies and program checks in containers of this machine's engine."""

    isolates_programs = True
    needs_docker = True

    def model_host(self) -> str:
        """The host's address on the engine's default bridge: proxy containers reach it there,
        sandboxes never (their networks give the host no address)."""
        return host_address(docker_client())

    def open(self, spec: SandboxSpec) -> DockerSandbox:
        return DockerSandbox(spec).start()
