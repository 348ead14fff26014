"""What seeds the embedded model's draws: the conversation, not the calendar a harness writes
into it (hermes-agent's system prompt carries the day, openclaw's user messages the minute)."""

from __future__ import annotations

from solver_model.conversation import conversation_digest

TASK = "Task id: own-rotate-clockwise\nTest input:\n[[1,2],[3,4]]"


def hermes(day: str) -> list[dict]:
    return [{"role": "system", "content": f"You are a CLI AI Agent.\n\nConversation started: {day}\nModel: m"},
            {"role": "user", "content": TASK}]


def openclaw(stamp: str, text: str = TASK) -> list[dict]:
    return [{"role": "user", "content": f"[{stamp}] {text}"}]


def test_the_same_conversation_on_another_day_or_minute_draws_the_same():
    assert conversation_digest(hermes("Monday, December 07, 2026")) == \
        conversation_digest(hermes("Tuesday, December 08, 2026"))
    assert conversation_digest(openclaw("Mon 2026-12-07 13:54 UTC")) == \
        conversation_digest(openclaw("Tue 2026-12-08 00:05 UTC"))


def test_what_the_conversation_says_still_counts():
    assert conversation_digest(openclaw("Mon 2026-12-07 13:54 UTC")) != \
        conversation_digest(openclaw("Mon 2026-12-07 13:54 UTC", TASK.replace("[3,4]", "[3,5]")))
    assert conversation_digest(hermes("Monday, December 07, 2026")) != \
        conversation_digest(hermes("Monday, December 07, 2026")[:1])
    grids = [{"role": "user", "content": "[[2026, 12], [7, 13]]"}]
    assert conversation_digest(grids) != conversation_digest([{"role": "user", "content": "[[2026, 12], [8, 13]]"}])
