"""Every registered rewrite rule, proven on random instances in the float64 interpreter.

A rule reaches `RULES` only through `register`, which requires its random instance, so this file
covers every rule there is: each instance must match its own rule, and every match rewritten must
compute the same outputs (to float64 rounding) on fresh random inputs.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from tessera.ir.interp import run
from tessera.rewrite.rules import RULES, NotApplicable, View, apply, register
from tessera.rewrite.rules.base import Rule

TRIALS = 16


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_holds_on_random_instances(name: str) -> None:
    rule = RULES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    rewritten = 0
    for trial in range(TRIALS):
        g = rule.instance(rng)
        g.validate()
        view = View(g)
        matches = [m for m in (rule.match(view, n) for n in g.nodes) if m is not None]
        assert matches, f"{name}: instance {trial} does not match its own rule"
        feeds = {i: rng.standard_normal(g.types[i].shape).astype(np.float32) for i in g.inputs}
        want = run(g, feeds, exact=True)
        for m in matches:
            try:
                h = apply(g, rule, m)
            except NotApplicable:
                continue
            h.validate()
            assert not h.same_as(g), f"{name}: the rewrite changed nothing"
            got = run(h, feeds, exact=True)
            for o in g.outputs:
                assert got[o].shape == want[o].shape
                # exact equations to float64 rounding; a folded constant to its one rounding, scaled by
                # the largest output (the products after it sum a few rounded terms)
                tol = max(1e-9, 8 * rule.rounding)
                np.testing.assert_allclose(got[o], want[o], rtol=tol, atol=max(1e-12, tol * np.abs(want[o]).max()),
                                           err_msg=f"{name}, instance {trial}, output {o}")
            rewritten += 1
    assert rewritten >= TRIALS // 2, f"{name}: only {rewritten} of {TRIALS} instances could be rewritten"


def test_a_rule_without_a_proof_cannot_register() -> None:
    some = next(iter(RULES.values()))
    with pytest.raises(ValueError, match="no random instance"):
        register(Rule("unproven", "x = y", some.match, some.build, None))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="two rules"):
        register(some)
