"""Stage `orchestrate`: primitive graph (+ costs) -> plan of kernels."""
from tessera.orchestrate.blp import DEFAULT_SOLVER, SOLVERS
from tessera.orchestrate.candidates import Candidate, CandidateRules, KernelLegality, StructuralLegality
from tessera.orchestrate.graphview import OGraph, build_ograph
from tessera.orchestrate.orchestrator import STRATEGIES, orchestrate
from tessera.orchestrate.plan import Plan

__all__ = ["DEFAULT_SOLVER", "Candidate", "CandidateRules", "KernelLegality", "OGraph", "Plan", "SOLVERS", "STRATEGIES",
           "StructuralLegality", "build_ograph", "orchestrate"]
