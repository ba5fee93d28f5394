"""Plans compiled before, reused: what makes a warm recompile of a PyTorch graph take seconds.

`torch.compile(backend="tessera")` compiles again whenever dynamo re-captures a graph (a new
process, a guard that failed, a reset). With the tuning database warm, the measuring is gone, but
enumerating candidates, solving and choosing schedules still take a minute for a model like
GPT-2. A plan depends only on the model, the compile options, the GPU and the software, so it is
stored under a hash of those: `$TESSERA_CACHE/plans/<key>.json` holds plan.json's content and the
choices that rebuild its primitive graph (as an artifact's artifact.json does, without the model:
the caller has it). A hit re-runs only the deterministic passes (frontend, fission, rewrites,
precision, the layout replay), checks the rebuilt graph against the stored digest, and builds the
executable; nothing is planned or measured.

Measured plans also depend on the tuning database; one that was re-tuned since gives the plan it
gave before, until `tessera cache clear` (or `CompileOptions(plan_cache=False)`).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import onnx
import torch

from tessera import cache
from tessera.errors import TesseraError
from tessera.frontend import LoadedModel
from tessera.log import logger
from tessera.runtime.artifact import faulting_chains, graph_digest, rebuild_graph
from tessera.runtime.executable import Executable
from tessera.version import __version__

# CompileOptions fields that change no plan (where measurements go, how many build workers).
_NOT_PLAN = {"db", "tune_workers", "plan_cache", "time_limit"}


def plan_dir(create: bool = True) -> Path:
    d = cache.cache_root() / "plans"
    if create:
        d.mkdir(parents=True, exist_ok=True)
    return d


def model_digest(model: onnx.ModelProto) -> str:
    """SHA-256 of what a model computes: its nodes, inputs, outputs, opsets and initializers, the
    weights' bytes hashed where they lie. Serializing the whole model to hash it took 2-3 s for
    BERT-base on a CPU; this takes a tenth of that. The graph's name (a label) is left out."""
    h = hashlib.sha256(f"ir{model.ir_version}|".encode())
    g = model.graph
    for part in (model.opset_import, model.functions, g.node, g.input, g.output, g.value_info, g.sparse_initializer):
        for m in part:
            h.update(m.SerializeToString())
        h.update(b"|")
    for t in g.initializer:
        raw = t.raw_data
        if raw:  # the weights: hashed in place of a serialized copy
            h.update(f"{t.name}:{t.data_type}:{list(t.dims)}:{t.data_location}:".encode())
            h.update(raw)
        else:  # small or typed-field tensors
            h.update(t.SerializeToString())
    return h.hexdigest()


def plan_key(model_digest: str, options: Any, gpu_name: str) -> str:
    """A hash of everything a plan depends on: the model (`model_digest`), the options that change
    plans, the GPU and the software."""
    from tessera.cost.db import software_versions

    h = hashlib.sha256(model_digest.encode())
    opts = {k: v for k, v in asdict(options).items() if k not in _NOT_PLAN}
    h.update(json.dumps({"options": opts, "gpu": gpu_name, "software": software_versions(),
                         "tessera": __version__}, sort_keys=True, default=str).encode())
    return h.hexdigest()[:40]


def lookup(key: str, model: LoadedModel, device: torch.device) -> Executable | None:
    """The cached plan's executable for `model` (loaded by the frontend), or None (absent, or
    stale: then it is removed)."""
    f = plan_dir(create=False) / f"{key}.json"
    if not f.is_file():
        return None
    try:
        doc = json.loads(f.read_text())
        faulty = faulting_chains(doc["plan"])
        if faulty:  # planned before those tiles left the search (session 62): plan again without them
            raise ValueError(f"kernels {', '.join(faulty)} use chain tiles that Triton compiles into faulting kernels")
        graph = rebuild_graph(model, doc["meta"])
        if graph_digest(graph) != doc["meta"]["graph_digest"]:
            raise ValueError("the rebuilt graph differs from the planned one")
        exe = Executable(graph, doc["plan"], device)
    except (OSError, ValueError, KeyError, TypeError, TesseraError) as e:
        logger.info("plan cache: %s is stale (%s); compiling again", f.name, e)
        f.unlink(missing_ok=True)
        return None
    os.utime(f)  # recently used
    return exe


def store(key: str, plan: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write the entry atomically (a reader never sees half a file)."""
    d = plan_dir()
    tmp = d / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"plan": plan, "meta": meta}))
    tmp.replace(d / f"{key}.json")


def usage() -> tuple[int, int]:
    """(entries, bytes) in the plan cache."""
    files = list(plan_dir(create=False).glob("*.json"))  # a missing folder globs nothing
    return len(files), sum(f.stat().st_size for f in files)


def clear() -> tuple[int, int]:
    """Remove every cached plan; (entries, bytes) freed."""
    files = list(plan_dir(create=False).glob("*.json"))
    freed = sum(f.stat().st_size for f in files)
    for f in files:
        f.unlink(missing_ok=True)
    return len(files), freed
