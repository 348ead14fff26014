"""carc's driver for hermes-agent, run inside the sandbox: one user message in, the final text out.

stdin: {"session": id, "message": text, "new": bool, "base_url", "model", "effort"}. The agent is
driven in-process (so the background review thread can be joined before exit); the conversation
is resumed from hermes' own state.db by session id. stdout: one JSON object.
"""
import json
import os
import sys
import threading
import time

os.environ.setdefault("HERMES_HOME", "/state/hermes")
request = json.loads(sys.stdin.read())
os.makedirs(os.environ["HERMES_HOME"], exist_ok=True)

from hermes_cli.config import load_config  # noqa: E402
from hermes_constants import resolve_reasoning_config  # noqa: E402
from hermes_state import SessionDB  # noqa: E402
from run_agent import AIAgent  # noqa: E402

TOOLSETS = ["file", "terminal", "code_execution", "memory", "skills", "todo", "session_search"]

start = time.time()
config = load_config()
db = SessionDB()
history = None
if not request.get("new"):
    history = [m for m in db.get_messages_as_conversation(request["session"], repair_alternation=True)
               if m.get("role") != "session_meta"]
agent = AIAgent(base_url=request["base_url"], api_key=os.environ.get("OPENAI_API_KEY", ""),
                provider="custom", api_mode="chat_completions", model=request["model"],
                quiet_mode=True, platform="cli", session_db=db, session_id=request["session"],
                enabled_toolsets=TOOLSETS,
                reasoning_config=resolve_reasoning_config(config, request["model"]))
agent._print_fn = lambda *a, **k: print(*a, file=sys.stderr)
result = agent.run_conversation(request["message"], conversation_history=history)
for thread in threading.enumerate():  # the background memory/skill review must finish
    if thread.name.startswith("bg-review"):
        thread.join(timeout=900)
out = {"final": result.get("final_response") or "", "failed": bool(result.get("failed")),
       "error": result.get("error"), "api_calls": result.get("api_calls", 0),
       "prompt_tokens": result.get("prompt_tokens") or result.get("input_tokens") or 0,
       "completion_tokens": result.get("completion_tokens") or result.get("output_tokens") or 0,
       "seconds": round(time.time() - start, 3)}
try:
    agent.close()
    db.close()
finally:
    print(json.dumps(out))
