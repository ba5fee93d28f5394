"""GEMM-chain tuning after the solve (cost/measured.py: `tune_schedules` for chain kernels): the
neighbour walk from the fastest schedules, its limits, faulted schedules, and candidates that share
a chain core. Fake profilers price the schedules; no kernel runs.
"""
from __future__ import annotations

import pytest
from test_chain import attention, whole_kernel

from tessera.codegen.kernels import ChainSchedule
from tessera.codegen.select import TritonLegality, prologue_of
from tessera.cost.measured import _schedule_key
from tessera.fission import fission
from tessera.frontend import load
from tessera.orchestrate import build_ograph
from tessera.rewrite.deferred import defer_normalization


def tuned_attention():
    """An attention kernel for tuning tests: (graph, primitives, operand prologue, outputs)."""
    model, _ = attention(64, 256, 64, heads=4)
    g, _, nodes, outputs = whole_kernel(model)
    og = build_ograph(g)
    prims = list(og.nodes)
    return g, prims, prologue_of(og, prims), outputs


def test_tuning_walks_to_the_warps_and_stages_the_model_missed(tmp_path):
    """After the tiling families, a chain's tuning measures the fastest one's warp and stage
    neighbours: the fastest schedule here is the first family's pick with its warps or stages changed."""
    from dataclasses import replace

    from tessera.cost.chain_search import chain_space
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import (CHAIN_FIRST, CHAIN_MOST, CHAIN_STARTS, _schedule_key, template_space,
                                       tune_schedules)

    g, prims, pro, outputs = tuned_attention()
    ranked = template_space(g, prims, pro, outputs, "fp32", None)
    head = ranked[0]
    space = set(chain_space(g, pro + prims))
    near = [replace(head, num_warps=w) for w in (4, 8)] + [replace(head, num_stages=st) for st in (1, 2, 3)]
    # A neighbour that rank order alone would never measure.
    fastest = next(s for s in near if s != head and s in space and s not in ranked[:CHAIN_MOST])

    class Profiler:
        keys: list[str] = []

        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                self.keys.append(j.key.schedule)
                record(i, 1e-6 if j.schedule == fastest else 1e-5 if j.schedule is not None else 1e-3, "")

    prof = Profiler()
    with TuningDB(tmp_path / "t.db") as db:
        best = tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", "v1")
    assert best["k_chain"] == (fastest, 1e-6) and _schedule_key(fastest) in prof.keys
    # Here every other schedule ties, so each is near the fastest until the neighbour is found:
    # one round of walks from CHAIN_STARTS of them (13 neighbours each at most: 2 warps, 3 stages,
    # the row and column blocks, L and K halved and doubled).
    assert len(prof.keys) <= CHAIN_FIRST + CHAIN_STARTS * 13


@pytest.mark.parametrize("field", ["block_m", "block_n"])
def test_tuning_walks_to_the_row_or_column_block_the_model_missed(tmp_path, field):
    """The walk also halves and doubles the row and the output column block (attn_s6 tf32 on the H100
    tuned to m16 where m32 ran 11% faster, sessions 37 and 41): here the fastest schedule is the
    model's first pick with one of them changed, a schedule rank order alone would never measure."""
    from dataclasses import replace

    from tessera.cost.chain_search import chain_space
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import CHAIN_MOST, template_space, tune_schedules

    model, _ = attention(1024, 256, 128, heads=2)  # more tiling families than rank order measures
    g, _, nodes, outputs = whole_kernel(model)
    og = build_ograph(g)
    prims = list(og.nodes)
    pro = prologue_of(og, prims)
    ranked = template_space(g, prims, pro, outputs, "fp32", None)
    space = set(chain_space(g, pro + prims))
    # The first schedule measured with its row (column) block halved or doubled, in a tiling family
    # (block_m x block_n) that none of the schedules rank order measures holds: no other move of
    # the walk changes a family, so only this one reaches it.
    families = {(s.block_m, s.block_n) for s in ranked[:CHAIN_MOST]}
    near = [replace(ranked[0], **{field: f(getattr(ranked[0], field))}) for f in (lambda b: b * 2, lambda b: b // 2)]
    fastest = next((s for s in near if s in space and (s.block_m, s.block_n) not in families), None)
    assert fastest is not None, (field, ranked[0], families)

    class Profiler:
        schedules: list = []

        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                self.schedules.append(j.schedule)
                record(i, 1e-6 if j.schedule == fastest else 1e-5 if j.schedule is not None else 1e-3, "")

    prof = Profiler()
    with TuningDB(tmp_path / "t.db") as db:
        best = tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", "v1")
    assert best["k_chain"] == (fastest, 1e-6) and fastest in prof.schedules


def test_a_schedule_that_faulted_for_another_kernel_is_not_run(tmp_path):
    """A chain schedule recorded as faulting the GPU for one kernel is neither measured nor chosen
    for another (a miscompiled schedule faults now and then: one clean timing does not clear it).
    Here it would be the fastest by far."""
    from tessera.cost.db import Key, TuningDB
    from tessera.cost.measured import _schedule_key, template_space, tune_schedules

    g, prims, pro, outputs = tuned_attention()
    bad = template_space(g, prims, pro, outputs, "fp32", None)[0]

    class Profiler:
        keys: list = []

        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                self.keys.append(j.schedule)
                record(i, 1e-7 if j.schedule == bad else 1e-5 if j.schedule is not None else 1e-3, "")

    for faulted, expect_bad in ((False, True), (True, False)):
        prof = Profiler()
        prof.keys = []
        with TuningDB(tmp_path / f"t{faulted}.db") as db:
            if faulted:
                db.put(Key("fake", "v1", "another-kernel", _schedule_key(bad)), float("inf"),
                       "time: the GPU faulted running it (AcceleratorError: CUDA error: an illegal memory access)")
            best = tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", "v1")
        assert (best["k_chain"][0] == bad) == expect_bad and (bad in prof.keys) == expect_bad


def test_a_flat_landscape_stops_the_walk(tmp_path):
    """Where every schedule ties, each is near the fastest and the walk could go on while the space
    lasts: it stops after CHAIN_ROUNDS rounds, CHAIN_WALK schedules measured at most."""
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import CHAIN_WALK, tune_schedules

    g, prims, pro, outputs = tuned_attention()

    class Profiler:
        batches: list[int] = []

        def measure(self, jobs, record) -> None:
            self.batches.append(len(jobs))
            for i, j in enumerate(jobs):
                record(i, 1e-5 if j.schedule is not None else 1e-3, "")

    prof = Profiler()
    with TuningDB(tmp_path / "t.db") as db:
        tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", "v1")
    assert sum(prof.batches) <= CHAIN_WALK and len(prof.batches) <= 1 + 4


def test_tuning_walks_from_every_schedule_near_the_fastest(tmp_path):
    """A family measured a little slower than the fastest at the model's warps can win at other
    warps (attn_s2 fp16 on the H100): the walk starts from each schedule within CHAIN_NEAR."""
    from dataclasses import replace

    from tessera.cost.chain_search import chain_space
    from tessera.cost.db import TuningDB
    from tessera.cost.measured import CHAIN_FIRST, CHAIN_MOST, CHAIN_NEAR, template_space, tune_schedules

    g, prims, pro, outputs = tuned_attention()
    ranked = template_space(g, prims, pro, outputs, "fp32", None)
    space = set(chain_space(g, pro + prims))
    head, second = ranked[0], ranked[1]
    warps = [replace(second, num_warps=w) for w in (4, 8)] + [replace(second, num_stages=st) for st in (1, 2, 3)]
    fastest = next(s for s in warps if s != second and s in space and s not in ranked[:CHAIN_MOST])
    assert fastest not in {replace(head, num_warps=w) for w in (4, 8)} | {replace(head, num_stages=st)
                                                                          for st in (1, 2, 3)}

    class Profiler:
        keys: list = []

        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                self.keys.append(j.schedule)
                t = {head: 1e-5, second: 1e-5 * (1 + CHAIN_NEAR / 2), fastest: 1e-6}.get(j.schedule, 3e-5)
                record(i, t if j.schedule is not None else 1e-3, "")

    prof = Profiler()
    with TuningDB(tmp_path / "t.db") as db:
        best = tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", "v1")
    assert best["k_chain"] == (fastest, 1e-6)
    assert second in prof.keys[:CHAIN_FIRST + 1]


def test_candidates_around_one_chain_core_measure_its_fastest_schedule_once(tmp_path):
    """Every chain candidate around the same two matmuls (more or less of the scale and layout
    fused) but the first is measured at the first one's fastest schedule, not at CHAIN_CANDIDATE
    schedules of its own (segformer_b0 had 38 such candidates per attention block). The first is
    measured at CHAIN_CANDIDATE schedules and its fastest's warp twin."""
    from fake_profiler import core_measurements

    from tessera.cost.measured import CHAIN_CANDIDATE
    from tessera.orchestrate.candidates import CandidateRules

    model, _ = attention(40, 72, 64, heads=2, mask="additive", seed=9)
    g = defer_normalization(fission(load(model).graph).graph)[0]
    og = build_ograph(g)
    chains, best = core_measurements(og, ChainSchedule, CandidateRules(max_linear=2), TritonLegality(chains=True),
                                     tmp_path / "t.db")
    firsts = [s for s, v in chains.items() if len(v) > 1]
    assert len(firsts) == 1 and len(chains) > 1  # one core here, several candidates around it
    (first,) = firsts
    assert len(chains[first]) == CHAIN_CANDIDATE + 1
    assert all(v == [next(s for s in chains[first] if _schedule_key(s) == best)]
               for sig, v in chains.items() if sig != first)


def test_a_chain_core_is_timed_at_its_fastest_first_schedules_other_warps_before_the_solve(tmp_path):
    """The chain model prices warps by occupancy alone, so a core's first schedules can all come at
    the wrong warps (attn_s6 tf32 on the H200, session 42: all at 8, and the chain lost the solve by
    1%). Before the solve, the fastest of them is timed at the other warps too, and every candidate
    around the core is priced at the faster: here 4 warps run twice as fast as 8, the rest the same."""
    from dataclasses import replace

    from tessera.cost.db import TuningDB
    from tessera.cost.measured import CHAIN_CANDIDATE, MeasuredCost
    from tessera.orchestrate import orchestrate
    from tessera.orchestrate.candidates import CandidateRules

    model, _ = attention(40, 72, 64, heads=2, mask="additive", seed=9)
    g = defer_normalization(fission(load(model).graph).graph)[0]
    og = build_ograph(g)
    timed: dict[str, list] = {}

    class Profiler:
        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                s = j.schedule
                if isinstance(s, ChainSchedule):
                    timed.setdefault(j.key.signature, []).append(s)
                    eight = 1e-5 * (1 + (s.block_m + s.block_l) / 1000)  # 8 warps: slower for larger tiles
                    record(i, eight if s.num_warps == 8 else eight / 2, "")
                else:
                    record(i, 1e-3, "")  # everything else is far slower: the plan is one chain kernel

    with TuningDB(tmp_path / "t.db") as db:
        plan = orchestrate(og, MeasuredCost(og, db, Profiler(), "fake", "v1", templates=True),
                           rules=CandidateRules(max_linear=2), legality=TritonLegality(chains=True))
    (first,) = [sig for sig, v in timed.items() if len(v) > 1]
    firsts = timed[first][:CHAIN_CANDIDATE]
    fastest = min(firsts, key=lambda s: (s.num_warps == 8, s.block_m + s.block_l))
    twin = replace(fastest, num_warps=12 - fastest.num_warps)
    assert twin in timed[first] and twin not in firsts
    price = min(1e-5 * (1 + (s.block_m + s.block_l) / 1000) / (2 if s.num_warps == 4 else 1)
                for s in (fastest, twin))
    assert any(k.cost_s == pytest.approx(price) for k in plan.kernels)


def test_under_pdl_the_walk_times_each_start_launched_late(tmp_path):
    """Timed back to back under programmatic dependent launch, a chain tile can run slower than it runs
    alone (attn_s3's m64 n64 l128 k64 w4 s3 on the H100, session 63: 8.59 µs, against 6.85 without PDL).
    Where the tuning times PDL launches, the walk also times each start launched late (only as the kernel
    before it ends) and keeps it where it is faster; without PDL it times no such twin."""
    from dataclasses import replace

    from tessera.cost.db import TuningDB
    from tessera.cost.measured import template_space, tune_schedules

    g, prims, pro, outputs = tuned_attention()
    head = template_space(g, prims, pro, outputs, "fp32", None)[0]

    class Profiler:
        def __init__(self) -> None:
            self.schedules: list = []

        def measure(self, jobs, record) -> None:
            for i, j in enumerate(jobs):
                self.schedules.append(j.schedule)
                s = j.schedule
                t = 1e-3 if s is None else 5e-6 if s == replace(head, late=True) else 8e-6 if s == head else 9e-6
                record(i, t, "")

    for pdl in (False, True):
        prof = Profiler()
        versions = "tessera 0 codegen 1 timing 2" + (" pdl" if pdl else "") + "; torch 2"
        with TuningDB(tmp_path / f"t{pdl}.db") as db:
            best = tune_schedules(g, [("k_chain", prims, pro, outputs)], db, prof, "fake", versions)
        late = [s for s in prof.schedules if s is not None and s.late]
        if pdl:
            assert best["k_chain"] == (replace(head, late=True), 5e-6)
            assert replace(head, late=True) in late and all(replace(s, late=False) in prof.schedules for s in late)
        else:
            assert best["k_chain"] == (head, 8e-6) and not late


def test_the_late_trigger_is_a_schedule_key_a_plan_field_and_a_launch_mode(monkeypatch):
    """`late` round-trips through the tuning database's key and plan.json, stays out of the chain model's
    samples (it prices the tile, not how it launches), and in a one-kernel plan launches the kernel with
    PDL=2: the kernel before it is itself, in the next call (as in the tuning's timing graph)."""
    from dataclasses import fields, replace

    from tessera.codegen import launch
    from tessera.codegen.kernels import schedule_from_json
    from tessera.cost.chain_search import ChainFeatures, chain_key, db_samples, parse_chain_key
    from tessera.runtime import executable

    s = ChainSchedule(64, 64, 128, 64, 4, 3)
    late = replace(s, late=True)
    assert chain_key(late) == "chain-m64-n64-l128-k64-w4-s3-late" and parse_chain_key(chain_key(late)) == late
    assert parse_chain_key(chain_key(replace(late, split_l=2))) == replace(late, split_l=2)
    assert parse_chain_key(chain_key(s)) == s and "late" not in s.to_json()
    assert schedule_from_json(late.to_json()) == late
    feat = {f.name: 1 for f in fields(ChainFeatures)}
    assert [x for _, (_, x, _) in db_samples([("sig", chain_key(x), 1e-5, feat) for x in (s, late)])] == [s]

    model, _ = attention(13, 31, 64, heads=2, mask="causal", seed=2)
    from test_chain import FORCE, compile_model
    from tessera.compiler import plan_document

    result = compile_model(model, FORCE)
    plan = plan_document(result)
    (kernel,) = [k for k in plan["kernels"] if k.get("schedule", {}).get("form") == "chain"]
    monkeypatch.setattr(executable, "pdl_supported", lambda device: True)

    def mode() -> int:
        exe = executable.Executable(result.graph, plan, "cpu")
        return next(st.kernel.pdl for st in exe.steps if st.impl.name == kernel["name"])
    assert mode() == 1
    kernel["schedule"]["late"] = True
    assert mode() == 2
    exe = executable.Executable(result.graph, plan, "cpu")
    seen = []
    k = next(st.kernel for st in exe.steps if st.impl.name == kernel["name"])
    k.launches = [(type("F", (), {"__getitem__": lambda self, grid: lambda *a, **m: seen.append(m)})(), g, m)
                  for _, g, m in k.launches]
    k(*[launch.torch.empty(0)] * (len(k.ks.inputs) + len(k.ks.outputs)))
    assert seen and all(m["PDL"] == 2 and m["launch_pdl"] for m in seen)


def test_the_kernel_before_a_late_one_lets_it_launch_only_as_it_ends():
    """`pdl_modes`: a generated kernel launches with PDL=2 where the next step that runs on the GPU is a
    late kernel, else 1; views run nothing and are passed over; the last kernel's next is the first (the
    next call's). Steps without a generated kernel (library calls) get 0."""
    from types import SimpleNamespace as NS

    from tessera.runtime.executable import pdl_modes

    def step(backend: str, late: bool | None = None):
        kernel = None if late is None else NS(ks=NS(schedule=ChainSchedule(64, 64, 64, 64, late=late)))
        return NS(impl=NS(backend=backend), kernel=kernel)

    gen, late, lib, view = step("triton", False), step("template", True), step("linear"), step("view")
    assert pdl_modes([gen, view, late, gen]) == [2, 0, 1, 1]
    assert pdl_modes([late, gen, lib, gen]) == [1, 1, 0, 2]  # the last one's next is the first, late
    assert pdl_modes([gen, lib, late]) == [1, 0, 1]  # after a library call a kernel launches as it ends anyway
    assert pdl_modes([late]) == [2] and pdl_modes([gen]) == [1]
