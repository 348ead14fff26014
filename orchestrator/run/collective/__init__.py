"""The collective regime (the seed's second regime): many users, one system, learning between rounds.

`schedule`: every user's stream and rounds; `runner`: a round of every user, then the update
step that writes the next round's shared state; docs/collective.md says what is measured.
"""
