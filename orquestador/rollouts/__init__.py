"""Rollouts: one operation across many machines, in batches, with a failure budget.

`store.py` writes a rollout and starts its children (the budget and the batch checked in
the statement that takes the next item); `control.py` is what an operator does to one
(pause, resume, cancel, retry the failed); `reading.py` what the pages and the API show.
"""
