"""Policies: the forward/initial_state contract, heads, built-in networks and their generators.

See docs/policies.md. Heavy modules (VPT) are imported lazily by the generators.
"""

from craftrl.policies.base import ActResult, Policy
from craftrl.policies.default import ImpalaRecurrentPolicy, MLPPolicy
from craftrl.policies.generators import (
    POLICY_GENERATORS,
    default_policy_generator,
    make_policy_generator,
    mlp_policy_generator,
    vpt_policy_generator,
    vpt_tiny_policy_generator,
)
from craftrl.policies.heads import CategoricalHead, EwmaNormalizer, ValueHead
from craftrl.policies.state import (
    detach_state,
    merge_states,
    select_state,
    split_state,
    state_from_numpy,
    state_to_numpy,
    tree_map,
)

__all__ = [
    "ActResult", "Policy", "ImpalaRecurrentPolicy", "MLPPolicy", "CategoricalHead", "EwmaNormalizer",
    "ValueHead", "POLICY_GENERATORS", "default_policy_generator", "make_policy_generator",
    "mlp_policy_generator", "vpt_policy_generator", "vpt_tiny_policy_generator", "detach_state",
    "merge_states", "select_state", "split_state", "state_from_numpy", "state_to_numpy", "tree_map",
]
