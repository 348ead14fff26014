"""The one root of carc's errors, and the kinds a caller can target.

    CarcError                       anything carc raises on purpose
      UserError                     the user can fix it: the message says what, where and how;
        ConfigError  (ValueError)     the CLI prints it as one line, without a traceback
        MachineError (RuntimeError)   a grid file, a flag, a labels or prices file; or this machine
                                      lacks something (a Docker engine, an image, internet)
      InfrastructureError (RuntimeError)
                                    a component of a run failed under it (a sandbox, a proxy, the
                                    ARC-AGI-3 engine): never the learner's fault
      RunFailed (RuntimeError)      cells (or collective rows) of a run failed; each is listed and
                                    in logs/failures.jsonl, and `carc grid run --resume` goes on

Every other exception, carc's own included, is a bug or a failure to look into: the CLI shows its
traceback. Kinds keep the builtin base they had (`ValueError`, `RuntimeError`), so a caller that
catches the builtin still does. This module imports nothing of carc's: every layer may use it
(but not what the proxy image runs: `proxy/addon.py` and the modules it imports).
"""

from __future__ import annotations


class CarcError(Exception):
    """Raised by carc on purpose; its message names what is wrong."""


class UserError(CarcError):
    """The user can fix it; the message says how (`carc` prints it as one line, exit code 2)."""


class ConfigError(UserError, ValueError):
    """A grid file, a command's flags, a labels, prompts or prices file is wrong: which one, where
    (file:line or field) and what to write instead."""


class MachineError(UserError, RuntimeError):
    """This machine lacks what the command needs (a Docker engine, an image, a network route):
    what is missing and the command that provides it."""


class InfrastructureError(CarcError, RuntimeError):
    """A component a run depends on failed under it (a sandbox, a proxy, the ARC-AGI-3 engine)."""


class RunFailed(CarcError, RuntimeError):
    """Some cells (or rows) of a run failed while the others went on: the message lists each with
    its error (also in the run's logs/failures.jsonl) and says how to resume."""
