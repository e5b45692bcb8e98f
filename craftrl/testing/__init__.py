"""Test support, shipped so that tests and benchmarks of your own can use it; no run imports it.

- ``scripted_env.ScriptedEnv``: a cheap deterministic env that can be told to die, hang or raise.
- ``counting_policy.CountingPolicy``: a recurrent policy whose value is its step count, for plumbing tests.
- ``simulated_nodes``: Ray nodes on this machine in mount and network namespaces of their own (root only), standing
  in for machines without the driver's disk or behind a slow link.
"""
