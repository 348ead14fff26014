"""carc's driver for hermes-agent, run inside the sandbox: one process per conversation (instance).

stdin, one JSON object per line: first {"session", "base_url", "model", "api_mode"}, then {"message": text}
for every user message; stdout: one JSON object per answered message. At end of input the
background review threads are joined (hermes starts them after a turn and would lose them at
exit), the agent is closed, and the process exits. Anything hermes prints goes to stderr, so
stdout carries only the protocol.
"""
import json
import os
import sys
import threading
import time

protocol = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("HERMES_HOME", "/state/hermes")
os.makedirs(os.environ["HERMES_HOME"], exist_ok=True)

from hermes_cli.config import load_config  # noqa: E402
from hermes_constants import resolve_reasoning_config  # noqa: E402
from hermes_state import SessionDB  # noqa: E402
from run_agent import AIAgent  # noqa: E402

TOOLSETS = ["file", "terminal", "code_execution", "memory", "skills", "todo", "session_search"]

setup = json.loads(sys.stdin.readline())
config = load_config()
db = SessionDB()
agent = AIAgent(base_url=setup["base_url"], api_key=os.environ.get("OPENAI_API_KEY", ""),
                provider="custom", api_mode=setup.get("api_mode", "chat_completions"), model=setup["model"],
                quiet_mode=True, platform="cli", session_db=db, session_id=setup["session"],
                enabled_toolsets=TOOLSETS,
                reasoning_config=resolve_reasoning_config(config, setup["model"]))
agent._print_fn = lambda *a, **k: print(*a, file=sys.stderr)
protocol.write(json.dumps({"ready": True}) + "\n")

history = None
spent = [0, 0]  # hermes reports the session's running totals; the protocol wants each turn's
for line in sys.stdin:
    if not line.strip():
        continue
    start = time.time()
    try:
        result = agent.run_conversation(json.loads(line)["message"], conversation_history=history)
    except Exception as exc:  # the orchestrator decides what a crash means
        protocol.write(json.dumps({"final": "", "failed": True, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        continue
    history = result.get("messages")
    totals = [result.get("prompt_tokens") or 0, result.get("completion_tokens") or 0]
    turn = [max(0, totals[0] - spent[0]), max(0, totals[1] - spent[1])]
    spent = totals
    protocol.write(json.dumps({
        "final": result.get("final_response") or "", "failed": bool(result.get("failed")),
        "error": result.get("error"), "api_calls": result.get("api_calls", 0),
        "prompt_tokens": turn[0], "completion_tokens": turn[1],
        "seconds": round(time.time() - start, 3)}) + "\n")

for thread in threading.enumerate():  # the background memory/skill review must finish
    if thread.name.startswith("bg-review"):
        thread.join(timeout=900)
try:
    agent.close()
    db.close()
finally:
    protocol.write(json.dumps({"closed": True}) + "\n")
