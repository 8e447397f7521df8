"""Users' persistent homes: where they live, how big they may grow, how much each holds.

A home's size is its quota. The hub measures every home itself (a user's server could report
anything); a write past the quota fails in the writer's own code and nowhere else.
"""
