"""The rewrite rules, by name. Each file holds a family: equations, preconditions, replacements and
the random instances that prove them (`tests/test_rewrite_rules.py`)."""
from __future__ import annotations

from tessera.rewrite.rules import (associative_matmul, broadcast_push, fold_constant, layout_chains, merge_matmul,
                                   pointwise_conv, reduce_matmul, scale_matmul, transposed_matmul)
from tessera.rewrite.rules.base import Match, NotApplicable, Rule, View, apply, find

RULES: dict[str, Rule] = {}


def register(rule: Rule) -> None:
    """Add a rule; it must carry a random instance (its proof) and a name of its own."""
    if not callable(rule.instance):
        raise ValueError(f"rule {rule.name} has no random instance, so no proof")
    if rule.name in RULES:
        raise ValueError(f"two rules are named {rule.name}")
    RULES[rule.name] = rule


for _family in (layout_chains, broadcast_push, reduce_matmul, scale_matmul, merge_matmul, transposed_matmul,
                associative_matmul, fold_constant, pointwise_conv):
    for _rule in _family.RULES:
        register(_rule)

__all__ = ["Match", "NotApplicable", "RULES", "Rule", "View", "apply", "find", "register"]
