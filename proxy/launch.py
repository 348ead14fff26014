"""A mitmdump that has done its imports before it is needed: a host proxy's warm spare.

`python proxy/launch.py` (the mitmproxy venv's python) imports mitmproxy, then waits for one
line on stdin: ``{"argv": [mitmdump, ...], "log": PATH}``. It sends its output to PATH and runs
mitmdump with that command line, exactly as the `mitmdump` console script would. Importing
mitmproxy is most of mitmdump's start-up (0.5-1 s); `proxy.host.HostProxy` keeps one spare per
orchestrator thread, so a cell's proxy starts in the time mitmdump takes to load its addon and
listen. A spare that gets EOF instead of a line (its orchestrator is gone) exits.

After mitmdump returns (its `done` hooks have run: the journal is complete and closed) the
process exits at once, without the interpreter's teardown of every module mitmproxy loaded.
"""

import json
import logging
import os
import sys

# sys.path as the console script has it (its own folder first), not this folder's modules
sys.path[0] = os.path.dirname(sys.executable)

from mitmproxy.tools import dump  # noqa: E402,F401 - what mitmdump() imports on its first call
from mitmproxy.tools.main import mitmdump  # noqa: E402


def main() -> None:
    line = sys.stdin.buffer.readline()
    if not line.strip():
        os._exit(0)
    spec = json.loads(line)
    log = os.open(spec["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    sys.argv = list(spec["argv"])
    code = 0
    try:
        mitmdump()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit code 1
        logging.exception("mitmdump failed")
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
