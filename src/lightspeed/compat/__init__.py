"""The one door to Lightning's internals.

Everything Lightspeed does that relies on what Lightning does not promise (private attributes, the
way its dispatcher calls hooks, its checkpoint callback's private steps) lives in this package, and
nowhere else. `tests/test_compat.py` checks each assumption on the installed Lightning and names the
one that an upgrade broke; `pyproject.toml` pins `lightning` to the minor series those tests pass on.
"""
