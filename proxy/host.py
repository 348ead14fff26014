"""Running the journaling proxy on the host: the dedicated mitmproxy venv and `HostProxy`.

mitmproxy is pinned (MITMPROXY_VERSION) and its pins (h11<=0.14) conflict with carc's own
environment, so it never lives there: `mitmdump_path()` finds or creates a venv just for it
(CARC_MITMPROXY_VENV, default <carc cache>/mitmproxy-<version>; the carc cache is CARC_CACHE or
~/.cache/carc). The proxy image installs the same version; `mitmdump_command()` builds the
command line both use.

    with HostProxy(run_dir / "journal", cell="c1", upstream="http://127.0.0.1:8765/v1") as proxy:
        proxy.set_slot(0, "before")
        client = openai.OpenAI(base_url=proxy.base_url, api_key="placeholder")
"""

from __future__ import annotations

import atexit
import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from orchestrator.errors import InfrastructureError
from proxy.journal import (JOURNAL_FILE, READY_FILE, JournalEntry, Phase, read_journal,
                           settle_in_flight, write_slot)

# The proxy's settings, for the host proxy and the proxy image alike (sandboxes reads them here).
MITMPROXY_VERSION = "11.0.2"
ADDON_PATH = Path(__file__).with_name("addon.py")
CONTROL_FILE = "slot.json"
CA_CERT_FILE = "mitmproxy-ca-cert.pem"
# What a learner holds instead of the key: the proxy swaps in the real one on the way out.
PLACEHOLDER_KEY = "carc-placeholder-key"
_PR_SET_PDEATHSIG = 1


class ProxyError(InfrastructureError):
    """The proxy could not be installed or started; the message says what to do."""


def carc_cache() -> Path:
    """carc's cache directory (images' inputs, the proxy CA, mitmproxy's venv): CARC_CACHE,
    default ~/.cache/carc. Made on first use."""
    path = Path(os.environ.get("CARC_CACHE") or Path.home() / ".cache" / "carc")
    path.mkdir(parents=True, exist_ok=True)
    return path


def mitmproxy_venv() -> Path:
    """CARC_MITMPROXY_VENV, default <carc cache>/mitmproxy-<version>."""
    default = carc_cache() / f"mitmproxy-{MITMPROXY_VERSION}"
    return Path(os.environ.get("CARC_MITMPROXY_VENV") or default)


def default_confdir() -> Path:
    """The proxy CA shared by host proxies and proxy containers: <carc cache>/mitmproxy-ca."""
    path = carc_cache() / "mitmproxy-ca"
    path.mkdir(parents=True, exist_ok=True)
    return path


def addon_options(*, journal_dir: str | os.PathLike[str], cell: str, control: str | os.PathLike[str],
                  confdir: str | os.PathLike[str], allow: Iterable[str] = (), key_env: str = "",
                  prices: str | os.PathLike[str] | None = None, tags: bool = False,
                  requests: Literal["inline", "raw"] = "inline") -> dict[str, str]:
    """The `--set` options of mitmdump with the journaling addon (declared in addon.py's `load`),
    for a host proxy and a proxy container alike; paths are as the proxy process sees them.
    Connections open lazily, so a down upstream is a journaled error, not a failed start."""
    return {
        "confdir": str(confdir),
        "connection_strategy": "lazy",
        "anticomp": "true",  # ask upstreams for identity encoding: streams are journaled as sent
        "carc_journal_dir": str(journal_dir),
        "carc_cell": cell,
        "carc_control": str(control),
        "carc_allow": ",".join(allow),
        "carc_key_env": key_env,
        "carc_prices": str(prices) if prices else "",
        "carc_tags": "true" if tags else "false",
        "carc_requests": requests,
    }


def set_arguments(options: dict[str, str]) -> list[str]:
    return [part for name, value in options.items() for part in ("--set", f"{name}={value}")]


def mitmdump_path() -> Path:
    """The pinned mitmdump, installing it into its own venv on first use (about 10 s)."""
    venv = mitmproxy_venv()
    exe = venv / "bin" / "mitmdump"
    if _installed(venv):
        return exe
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers / cells install it once
        if _installed(venv):
            return exe
        python = venv / "bin" / "python"
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", f"mitmproxy=={MITMPROXY_VERSION}"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
                raise ProxyError(
                    f"installing mitmproxy {MITMPROXY_VERSION} into {venv} failed at "
                    f"`{' '.join(step)}`:\n{tail}\n"
                    f"Fix the cause and run:\n  {sys.executable} -m venv {venv} && "
                    f"{python} -m pip install mitmproxy=={MITMPROXY_VERSION}\n"
                    f"or point CARC_MITMPROXY_VENV at a venv that has it.")
    if not _installed(venv):
        raise ProxyError(f"{exe} is missing after installing mitmproxy {MITMPROXY_VERSION} "
                         f"into {venv}; remove {venv} and try again")
    return exe


def _installed(venv: Path) -> bool:
    pattern = f"lib/python*/site-packages/mitmproxy-{MITMPROXY_VERSION}.dist-info"
    return (venv / "bin" / "mitmdump").exists() and any(venv.glob(pattern))


def mitmdump_command(mitmdump: str | os.PathLike[str], *, journal_dir: str | os.PathLike[str],
                     cell: str, control: str | os.PathLike[str], listen_host: str,
                     listen_port: int, confdir: str | os.PathLike[str],
                     mode: Literal["reverse", "regular"] = "reverse", upstream: str = "",
                     allow: Iterable[str] = (), key_env: str = "",
                     prices: str | os.PathLike[str] | None = None,
                     addon: str | os.PathLike[str] = ADDON_PATH, tags: bool = False,
                     requests: Literal["inline", "raw"] = "inline") -> list[str]:
    """The mitmdump command line of the journaling proxy (host and proxy image alike).

    Reverse mode forwards everything to `upstream` (scheme://host:port; a path is the client's
    business: mitmproxy keeps the request path). Connections are opened lazily so a down
    upstream is a journaled error, not a failed start, and nothing is dialled before the
    addon has judged the request. Large bodies are never streamed past the addon
    (no stream_large_bodies); only text/event-stream responses stream, teed by the addon.
    """
    if mode == "reverse":
        if not upstream:
            raise ValueError("reverse mode needs an upstream URL, e.g. http://127.0.0.1:8765/v1")
        parts = urlsplit(upstream)
        mode_spec = f"reverse:{parts.scheme}://{parts.netloc}"
    elif mode == "regular":
        mode_spec = "regular"
    else:
        raise ValueError(f"mode must be 'reverse' or 'regular', got {mode!r}")
    sets = addon_options(journal_dir=journal_dir, cell=cell, control=control, confdir=confdir,
                         allow=allow, key_env=key_env, prices=prices, tags=tags, requests=requests)
    return [str(mitmdump), "-q", "--listen-host", listen_host, "--listen-port", str(listen_port),
            "--mode", mode_spec, "-s", str(addon), *set_arguments(sets)]


class HostProxy:
    """mitmdump with the journaling addon, on 127.0.0.1 and a free port, for one cell.

    `key_env` names the variable (in this process's environment, inherited by mitmdump) that
    holds the real key; when it is unset the client's key passes unchanged.

    The child dies with its parent (PR_SET_PDEATHSIG, tied to the thread that starts it), and is
    stopped on exit (SIGTERM, so pending calls get their line, then SIGKILL).
    """

    def __init__(self, journal_dir: str | os.PathLike[str], cell: str, upstream: str = "",
                 allow: Iterable[str] = (), key_env: str = "",
                 mode: Literal["reverse", "regular"] = "reverse",
                 confdir: str | os.PathLike[str] | None = None,
                 prices: str | os.PathLike[str] | None = None,
                 control: str | os.PathLike[str] | None = None,
                 startup_timeout_s: float = 30.0, tags: bool = False,
                 requests: Literal["inline", "raw"] = "inline") -> None:
        self.journal_dir = Path(journal_dir)
        self.cell = cell
        self.upstream = upstream.rstrip("/")
        self.mode = mode
        allow = list(allow)
        if mode == "regular" and upstream:  # the client dials the upstream itself: allow it
            allow.append(urlsplit(upstream).netloc)
        self.allow = allow
        # an unset variable means no key to inject (the embedded model needs none); the addon
        # itself is strict, so the container path must blank the option the same way
        self.key_env = key_env if key_env and os.environ.get(key_env) else ""
        self.confdir = Path(confdir) if confdir else default_confdir()
        self.prices = prices
        self.control = Path(control) if control else self.journal_dir / CONTROL_FILE
        self.startup_timeout_s = startup_timeout_s
        self.tags = tags  # calls carry their user, slot and phase (journal.TAG_HEADER): the collective's
        self.requests = requests  # "raw": request bodies only in raw/ (journal.JournalEntry.request_body)
        self.port: int | None = None
        self.startup_s: float | None = None  # seconds from spawn to accepting connections
        self.log_path = self.journal_dir / "mitmdump.log"
        self._process: subprocess.Popen | None = None

    # --- addresses -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """What a client uses as its model base URL (reverse mode): the upstream's path kept."""
        return f"http://127.0.0.1:{self._port()}{urlsplit(self.upstream).path}"

    @property
    def proxy_url(self) -> str:
        """What a client uses as HTTP(S)_PROXY (regular mode)."""
        return f"http://127.0.0.1:{self._port()}"

    @property
    def ca_cert_path(self) -> Path:
        """The proxy's CA certificate (PEM), to install in a client's trust store."""
        return self.confdir / CA_CERT_FILE

    @property
    def journal_path(self) -> Path:
        return self.journal_dir / JOURNAL_FILE

    def _port(self) -> int:
        if self.port is None:
            raise ProxyError("the proxy is not running: use `with HostProxy(...) as proxy:`")
        return self.port

    # --- control ---------------------------------------------------------------------------

    def set_slot(self, slot: int | None, phase: Phase) -> None:
        write_slot(self.control, slot, phase)

    def entries(self) -> list[JournalEntry]:
        return read_journal(self.journal_path) if self.journal_path.exists() else []

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> HostProxy:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        mitmdump = mitmdump_path()
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.confdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):  # the free port can be taken between probe and bind
            port = free_port()
            command = mitmdump_command(
                mitmdump, journal_dir=self.journal_dir, cell=self.cell, control=self.control,
                listen_host="127.0.0.1", listen_port=port, confdir=self.confdir, mode=self.mode,
                upstream=self.upstream, allow=self.allow, key_env=self.key_env,
                prices=self.prices, tags=self.tags, requests=self.requests)
            (self.journal_dir / READY_FILE).unlink(missing_ok=True)
            t0 = time.monotonic()
            self._process = _SPARES.launch(mitmdump, command, self.log_path)
            if self._process is None:  # no warm spare for this thread: a cold start
                with open(self.log_path, "ab") as log:
                    self._process = subprocess.Popen(
                        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        preexec_fn=die_with_parent, start_new_session=True)
            if self._wait_ready(port, t0):
                self.port = port
                self.startup_s = time.monotonic() - t0
                _SPARES.prepare(mitmdump)  # the next proxy of this thread starts warm
                return
            if "address already in use" not in self._log_tail().lower() or attempt == 2:
                break
        raise ProxyError(f"mitmdump did not start (command: {' '.join(command)}); "
                         f"last lines of {self.log_path}:\n{self._log_tail()}")

    def _wait_ready(self, port: int, t0: float) -> bool:
        """True once the addon says it runs (an open port alone is not enough: mitmdump binds
        before the script is loaded, then exits if the script fails)."""
        assert self._process is not None
        ready = self.journal_dir / READY_FILE
        while time.monotonic() - t0 < self.startup_timeout_s:
            if self._process.poll() is not None:
                return False
            if ready.exists():
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return True
            time.sleep(0.01)
        self.stop()
        raise ProxyError(f"mitmdump did not get ready on 127.0.0.1:{port} within "
                         f"{self.startup_timeout_s:.0f} s; last lines of {self.log_path}:\n"
                         f"{self._log_tail()}")

    def fault(self) -> str | None:
        """Why this proxy cannot carry calls now (its process is gone), or None."""
        if self._process is None:
            return f"the host proxy of {self.cell} is not running"
        code = self._process.poll()
        if code is not None:
            return f"the host proxy (mitmdump) of {self.cell} exited with code {code}; see {self.log_path}"
        return None

    def stop(self) -> None:
        process, self._process = self._process, None
        self.port = None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        settle_in_flight(self.journal_dir)  # the calls a killed proxy left unjournaled

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.strip().splitlines()[-lines:]) or "(empty log)"


LAUNCH_PATH = Path(__file__).with_name("launch.py")


class _Spare:
    """One warm spare: `proxy/launch.py` with mitmproxy imported, waiting for its command line."""

    def __init__(self, mitmdump: Path):
        self.mitmdump = mitmdump
        # What a cold start would inherit; the spare serves a proxy only if all is still the same.
        self.pid, self.thread = os.getpid(), threading.get_ident()
        self.environ, self.cwd = dict(os.environ), os.getcwd()
        self.process = subprocess.Popen(
            [str(mitmdump.parent / "python"), str(LAUNCH_PATH)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent,
            start_new_session=True)

    def fits(self, mitmdump: Path) -> bool:
        return (self.mitmdump == mitmdump and self.pid == os.getpid()
                and self.thread == threading.get_ident() and self.environ == os.environ
                and self.cwd == os.getcwd() and self.process.poll() is None)

    def discard(self) -> None:
        if self.pid != os.getpid():
            return  # a forked child's copy: the spare is its parent's
        try:
            self.process.stdin.close()  # EOF: the spare exits by itself
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _SparePool:
    """A warm spare per thread (the child dies with the thread that started it, PR_SET_PDEATHSIG,
    so a spare only ever serves a proxy of the thread that made it). `launch` hands a fitting
    spare its command and returns it as the proxy's process, exactly as Popen would have run
    `command` (same environment, folder, session, output file); otherwise None: a cold start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spares: dict[int, _Spare] = {}

    def prepare(self, mitmdump: Path) -> None:
        if os.environ.get("CARC_PROXY_SPARE", "1") == "0":
            return
        with self._lock:
            current = self._spares.get(threading.get_ident())
            if current is not None and current.fits(mitmdump):
                return
            if current is not None:
                current.discard()
            self._spares[threading.get_ident()] = _Spare(mitmdump)

    def launch(self, mitmdump: Path, command: list[str], log_path: Path) -> subprocess.Popen | None:
        with self._lock:
            spare = self._spares.pop(threading.get_ident(), None)
        if spare is None:
            return None
        if not spare.fits(mitmdump):
            spare.discard()
            return None
        try:
            spare.process.stdin.write(json.dumps({"argv": command, "log": str(log_path)}).encode() + b"\n")
            spare.process.stdin.close()
        except OSError:  # it died meanwhile
            spare.discard()
            return None
        return spare.process

    def discard_all(self) -> None:
        with self._lock:
            spares, self._spares = list(self._spares.values()), {}
        for spare in spares:
            spare.discard()


_SPARES = _SparePool()
atexit.register(_SPARES.discard_all)


def prepare_spare() -> None:
    """Start this thread's warm spare now (a grid worker does at start-up), so that even its
    first cell's proxy starts warm. Installs mitmproxy's venv if needed."""
    _SPARES.prepare(mitmdump_path())


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at the moment (the caller binds it next)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn (Linux): the kernel sends `sig` to the child when the parent (thread) that
    spawned it dies, so a killed run leaves no proxy or model server behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
