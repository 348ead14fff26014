"""carc's helper for openclaw, run inside the sandbox (python3 of the base image, stdlib only).

  helper.py wait PORT SECONDS     wait until the gateway answers on 127.0.0.1:PORT
  helper.py turn                  stdin {"port", "session_key", "message", "timeout"}: one turn
                                  through the gateway's OpenAI-compatible endpoint; stdout one
                                  JSON line {"final", "usage", "seconds"} or {"failed", "error"}

The gateway token comes from OPENCLAW_GATEWAY_TOKEN. The connection stays open for the whole
turn: openclaw cancels a run whose client went away.
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through the proxy


def wait(port: int, seconds: float) -> int:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            LOCAL.open(f"http://127.0.0.1:{port}/", timeout=2).close()
            return 0
        except urllib.error.HTTPError:
            return 0  # it answers: up
        except OSError:
            time.sleep(0.25)
    print(f"the gateway did not answer on port {port} within {seconds:g} s", file=sys.stderr)
    return 1


def turn() -> int:
    job = json.loads(sys.stdin.read())
    body = json.dumps({"model": "openclaw", "messages": [{"role": "user", "content": job["message"]}]})
    request = urllib.request.Request(
        f"http://127.0.0.1:{job['port']}/v1/chat/completions", data=body.encode(), method="POST",
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {os.environ['OPENCLAW_GATEWAY_TOKEN']}",
                 "x-openclaw-session-key": job["session_key"]})
    start = time.time()
    try:
        with LOCAL.open(request, timeout=job.get("timeout", 900)) as response:
            reply = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:2000]
        print(json.dumps({"failed": True, "error": f"HTTP {exc.code}: {detail}"}))
        return 0
    except (OSError, ValueError) as exc:
        print(json.dumps({"failed": True, "error": f"{type(exc).__name__}: {exc}"}))
        return 0
    choices = reply.get("choices") or [{}]
    final = (choices[0].get("message") or {}).get("content") or ""
    print(json.dumps({"final": final, "usage": reply.get("usage") or {},
                      "seconds": round(time.time() - start, 3), "id": reply.get("id")}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "wait":
        sys.exit(wait(int(sys.argv[2]), float(sys.argv[3])))
    sys.exit(turn())
