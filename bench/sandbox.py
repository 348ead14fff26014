"""Sandbox and proxy timings, measured in one run on the real engine and the real mitmproxy.

    python bench/sandbox.py [--rounds 20] [--calls 300]

Prints container start (sandbox alone, and sandbox + proxy container), exec, wipe, snapshot and
restore times (median and p90 over rounds, with a state volume of ~200 files / 2 MB), and the
proxy's added latency (p50, p99) against a direct call, for a small JSON response and a streamed
(server-sent events) response. Targets from the sandbox issue: wipe < 0.25 s, proxy p50 < 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from proxy.host import HostProxy  # noqa: E402
from sandboxes.docker_sandbox import DockerSandbox, ProxySpec, SandboxSpec, prune  # noqa: E402
from sandboxes.images import docker_client, ensure_image  # noqa: E402
from sandboxes.networks import host_address  # noqa: E402

console = Console()
RUN = "bench-sandbox"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_sandbox(rounds: int) -> dict[str, list[float]]:
    client = docker_client()
    base = ensure_image("base", "auto", client)
    proxy_image = ensure_image("proxy", "auto", client)
    times: dict[str, list[float]] = {k: [] for k in
                                     ("start", "start+proxy", "exec", "wipe", "snapshot", "restore", "teardown")}
    fill = ("i=0; while [ $i -lt 200 ]; do mkdir -p /state/d$((i % 10)); "
            "head -c 10000 /dev/urandom > /state/d$((i % 10))/f$i; i=$((i+1)); done")
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "snap.tar.gz"
        for number in range(rounds):
            spec = SandboxSpec(base, RUN, f"bench-{number}")
            box = DockerSandbox(spec, client)
            times["start"].append(timed(box.start))
            times["exec"].append(timed(lambda: box.exec(["true"])))
            box.exec(["sh", "-c", fill])
            box.exec(["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 &"])
            times["snapshot"].append(timed(lambda: box.snapshot(snap)))
            times["wipe"].append(timed(box.wipe))
            times["restore"].append(timed(lambda: box.restore(snap)))
            times["teardown"].append(timed(box.teardown))
        for number in range(max(3, rounds // 4)):
            spec = SandboxSpec(base, RUN, f"bench-proxy-{number}", proxy=ProxySpec(
                proxy_image, Path(tmp) / f"journal-{number}", "http://host.docker.internal:9/v1"))
            box = DockerSandbox(spec, client)
            times["start+proxy"].append(timed(box.start))
            box.teardown()
    prune(client, run=RUN)
    return times


def upstream_app() -> FastAPI:
    app = FastAPI()
    small = {"id": "c1", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "ok"}}],
             "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        if not body.get("stream"):
            return small

        async def events():
            for k in range(20):
                yield ('data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":'
                       f'[{{"index":0,"delta":{{"content":"piece{k} "}}}}]}}\n\n')
                await asyncio.sleep(0)
            yield 'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],' \
                  '"usage":{"prompt_tokens":5,"completion_tokens":20,"total_tokens":25}}\n\n'
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")
    return app


def start_upstream(host: str) -> tuple[uvicorn.Server, threading.Thread, int]:
    """The scripted upstream on `host` (a free port); stops the bench with a message if it cannot bind."""
    server = uvicorn.Server(uvicorn.Config(upstream_app(), host=host, port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sys.exit(f"the bench upstream did not start on {host} (for containers: the host's address "
                     "on the default bridge; see `carc doctor`)")
        time.sleep(0.05)
    return server, thread, server.servers[0].sockets[0].getsockname()[1]


def bench_proxy(calls: int) -> dict[str, dict[str, list[float]]]:
    server, thread, port = start_upstream("127.0.0.1")
    upstream = f"http://127.0.0.1:{port}/v1"
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, HostProxy(Path(tmp), "bench", upstream) as proxy:
        for label, base_url in (("direct", upstream), ("proxy", proxy.base_url)):
            results[label] = {"small": [], "streamed": []}
            with httpx.Client(timeout=30) as http:
                for kind in ("small", "streamed"):
                    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                            "stream": kind == "streamed"}
                    for number in range(calls + 10):
                        start = time.perf_counter()
                        response = http.post(f"{base_url}/chat/completions", json=body)
                        response.read()
                        if number >= 10:  # warm-up calls are not counted
                            results[label][kind].append(time.perf_counter() - start)
    server.should_exit = True
    thread.join(5)
    return results


CLIENT = r"""
import json, sys, time, urllib.request
url, calls, stream = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "stream": stream}).encode()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
times = []
for n in range(calls + 10):
    start = time.perf_counter()
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json",
                                                           "authorization": "Bearer carc-placeholder-key"})
    opener.open(req, timeout=30).read()
    if n >= 10:
        times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def bench_container_proxy(calls: int) -> dict[str, dict[str, list[float]]]:
    """Sandbox -> proxy container -> host, against a container on the egress bridge -> host."""
    client = docker_client()
    base = ensure_image("base", "auto", client)
    proxy_image = ensure_image("proxy", "auto", client)
    gateway = host_address(client)
    server, thread, port = start_upstream(gateway)
    results: dict[str, dict[str, list[float]]] = {"direct": {}, "proxy": {}}
    with tempfile.TemporaryDirectory() as tmp:
        spec = SandboxSpec(base, RUN, "bench-latency", proxy=ProxySpec(
            proxy_image, Path(tmp) / "journal", f"http://host.docker.internal:{port}/v1"))
        with DockerSandbox(spec, client).start() as box:
            direct = client.containers.run(base, ["sleep", "infinity"], detach=True,
                                           network="carc-egress", labels={"org.carc.run": RUN},
                                           extra_hosts={"host.docker.internal": "host-gateway"})
            try:
                for kind, flag in (("small", "0"), ("streamed", "1")):
                    code, (stdout, stderr) = direct.exec_run(
                        ["python3", "-c", CLIENT, f"http://host.docker.internal:{port}/v1/chat/completions",
                         str(calls), flag], demux=True)
                    if code != 0:
                        sys.exit(f"direct client failed ({code}): {(stderr or b'').decode()[-500:]}")
                    results["direct"][kind] = json.loads(stdout)
                    inside = box.exec(["python3", "-c", CLIENT, f"{box.reverse_base_url()}"
                                       "/chat/completions", str(calls), flag], timeout=600)
                    if not inside.ok:
                        sys.exit(f"proxied client failed ({inside.returncode}): {inside.stderr[-500:]!r}")
                    results["proxy"][kind] = json.loads(inside.stdout)
            finally:
                direct.remove(force=True)
    server.should_exit = True
    thread.join(5)
    prune(client, run=RUN)
    return results


def latency_table(latency: dict[str, dict[str, list[float]]], title: str) -> float:
    table = Table("response", "direct p50 ms", "proxy p50 ms", "added p50 ms", "direct p99 ms",
                  "proxy p99 ms", "added p99 ms", "ratio p50", title=title)
    added_small = 0.0
    for kind in ("small", "streamed"):
        d, p = latency["direct"][kind], latency["proxy"][kind]
        d50, p50, d99, p99 = (quantile(d, .5) * 1e3, quantile(p, .5) * 1e3,
                              quantile(d, .99) * 1e3, quantile(p, .99) * 1e3)
        added_small = added_small or p50 - d50
        table.add_row(kind, f"{d50:.2f}", f"{p50:.2f}", f"{p50 - d50:.2f}", f"{d99:.2f}",
                      f"{p99:.2f}", f"{p99 - d99:.2f}", f"{p50 / d50:.2f}")
    console.print(table)
    return added_small


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()

    with console.status("sandbox lifecycle ..."):
        times = bench_sandbox(args.rounds)
    table = Table("operation", "median s", "p90 s", "n", title="sandbox (real Docker engine)")
    for name, values in times.items():
        table.add_row(name, f"{statistics.median(values):.3f}", f"{quantile(values, 0.9):.3f}",
                      str(len(values)))
    console.print(table)
    wipe = statistics.median(times["wipe"])
    console.print(f"wipe median {wipe:.3f} s (target < 0.25 s: {'met' if wipe < 0.25 else 'NOT met'})")

    with console.status("proxy latency ..."):
        latency = bench_proxy(args.calls)
    added_small = latency_table(latency, "proxy (host mitmdump, reverse mode; ladder cells)")
    console.print(f"proxy added p50 (small) {added_small:.2f} ms (target < 5 ms: "
                  f"{'met' if added_small < 5 else 'NOT met'})")
    with console.status("container proxy latency ..."):
        latency = bench_container_proxy(max(50, args.calls // 3))
    added = latency_table(latency, "proxy container (sandbox -> proxy -> host; harness cells), "
                                   "against a container on the egress bridge -> host")
    console.print(f"container proxy added p50 (small) {added:.2f} ms")


if __name__ == "__main__":
    main()
