"""A corpus of user mistakes: each gets exit code 2 and one line naming the problem, never a
traceback, never a silent success, and nothing the user owns is overwritten."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from opcheck import models_dir

from tessera.cli.main import main

MODELS = models_dir()


def _model(path: Path, nodes, inputs, outputs, opset: int = 17) -> Path:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(m, path)
    return path


def _vi(name: str, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """Bad files, and good artifacts to damage: attn_s7 (float inputs) and gpt2_tiny (token ids)."""
    d = tmp_path_factory.mktemp("bad")
    (d / "afile").write_text("mine\n")
    (d / "empty.onnx").write_bytes(b"")
    (d / "text.onnx").write_text("not a model\n")
    raw = (MODELS / "attn_s7.onnx").read_bytes()
    (d / "truncated.onnx").write_bytes(raw[: len(raw) // 2])
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    _model(d / "zero.onnx", relu, [_vi("x", [0, 4])], [_vi("y", [0, 4])])
    _model(d / "dup.onnx", relu, [_vi("x", [2, 4])], [_vi("y", [2, 4]), _vi("y", [2, 4])])
    _model(d / "noout.onnx", relu, [_vi("x", [2, 4])], [])
    _model(d / "op99.onnx", relu, [_vi("x", [2, 4])], [_vi("y", [2, 4])], opset=99)
    _model(d / "symbolic.onnx", relu, [_vi("x", ["batch", 4])], [_vi("y", ["batch", 4])])
    _model(d / "cycle.onnx", [helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
           [_vi("x", [2])], [_vi("b", [2])])
    _model(d / "unknown_op.onnx", [helper.make_node("Frobnicate", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    _model(d / "bad_attr.onnx", [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 0])], [_vi("x", [2, 3])],
           [_vi("y", [3, 2])])
    _model(d / "strings.onnx", [helper.make_node("Identity", ["x"], ["y"])], [_vi("x", [2], TensorProto.STRING)],
           [_vi("y", [2], TensorProto.STRING)])
    _model(d / "huge.onnx", [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["z"])],
           [_vi("x", [1 << 20, 1 << 20])], [_vi("z", [1 << 20, 1 << 20])])
    for name in ("attn_s7", "gpt2_tiny"):
        assert main(["compile", str(MODELS / f"{name}.onnx"), "-o", str(d / name), "--cost", "analytical"]) == 0
    return d


def _damaged(place: Path, name: str, edit) -> Path:
    out = place / f"damaged_{name}_{edit.__name__}"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(place / name, out)
    edit(out)
    return out


def _truncate_meta(a: Path) -> None:
    (a / "artifact.json").write_text('{"form')


def _old_format(a: Path) -> None:
    meta = json.loads((a / "artifact.json").read_text())
    (a / "artifact.json").write_text(json.dumps({**meta, "format": 0}))


def _no_kernels(a: Path) -> None:
    plan = json.loads((a / "plan.json").read_text())
    (a / "plan.json").write_text(json.dumps({**plan, "kernels": []}))


def _foreign_prims(a: Path) -> None:
    plan = json.loads((a / "plan.json").read_text())
    plan["kernels"][0]["prims"] = ["no_such_primitive"]
    (a / "plan.json").write_text(json.dumps(plan))


def _garbage_plan(a: Path) -> None:
    (a / "plan.json").write_text("[1, 2")


def _truncated_model(a: Path) -> None:
    g = a / "model.onnx"
    g.write_bytes(g.read_bytes()[:100])


def _feeds(place: Path, name: str, **arrays) -> str:
    path = place / f"{name}.npz"
    np.savez(path, **arrays)
    return str(path)


def _cases(p: Path) -> list[tuple[str, list[str], str]]:
    """(case, argv, what the message must say)."""
    m = str(MODELS / "attn_s7.onnx")
    gpt, attn = str(p / "gpt2_tiny"), str(p / "attn_s7")
    compile_ = ["compile", "--cost", "analytical", "-o"]
    return [
        ("missing model", [*compile_, str(p / "o1"), str(p / "nope.onnx")], "no such file"),
        ("empty model", [*compile_, str(p / "o2"), str(p / "empty.onnx")], "not a valid ONNX model"),
        ("text file as model", [*compile_, str(p / "o3"), str(p / "text.onnx")], "not a valid ONNX model"),
        ("truncated model", [*compile_, str(p / "o4"), str(p / "truncated.onnx")], "truncated or corrupt"),
        ("cycle", [*compile_, str(p / "o5"), str(p / "cycle.onnx")], "cycle"),
        ("unknown op", [*compile_, str(p / "o6"), str(p / "unknown_op.onnx")], "Frobnicate"),
        ("bad attribute", [*compile_, str(p / "o7"), str(p / "bad_attr.onnx")], "Transpose"),
        ("symbolic dim", [*compile_, str(p / "o8"), str(p / "symbolic.onnx")], "--input-shape x="),
        ("zero-sized dim", [*compile_, str(p / "o9"), str(p / "zero.onnx")], "no elements"),
        ("unsupported dtype", [*compile_, str(p / "o10"), str(p / "strings.onnx")], "'x'"),
        ("no outputs", [*compile_, str(p / "o11"), str(p / "noout.onnx")], "no outputs"),
        ("duplicate outputs", [*compile_, str(p / "o12"), str(p / "dup.onnx")], "more than once"),
        ("opset 99", [*compile_, str(p / "o13"), str(p / "op99.onnx")], "opset 99"),
        ("--input-shape wrong rank", [*compile_, str(p / "o14"), m, "--input-shape", "q=1x2x3"], "rank 3"),
        ("--input-shape unknown name", [*compile_, str(p / "o15"), m, "--input-shape", "nope=1x2"], "nope"),
        ("--input-shape contradicts", [*compile_, str(p / "o16"), m, "--input-shape", "q=2x1x512x64"], "fixes 1"),
        ("-o is a file", [*compile_, str(p / "afile"), m], "afile"),
        ("-o under a file", [*compile_, str(p / "afile" / "out"), m], "afile"),
        ("--time-limit -1", [*compile_, str(p / "o17"), m, "--time-limit", "-1"], "--time-limit"),
        ("--max-kernel-nodes 0", [*compile_, str(p / "o18"), m, "--max-kernel-nodes", "0"], "--max-kernel-nodes"),
        ("--seed -1", ["run", attn, "--seed", "-1"], "--seed"),
        ("--inputs missing", ["run", attn, "--inputs", str(p / "nope.npz")], "nope.npz"),
        ("--inputs not npz", ["run", attn, "--inputs", str(p / "afile")], ".npz"),
        ("--inputs floats for ids", ["run", gpt, "--inputs", _feeds(p, "f", x=np.random.rand(1, 128))],
         "holds float64"),
        ("--inputs ids past the vocabulary", ["run", gpt, "--check", "--inputs",
                                              _feeds(p, "big", x=np.full((1, 128), 5000))], "outside [-1000, 1000)"),
        ("--inputs wrong name", ["run", gpt, "--inputs", _feeds(p, "name", ids=np.zeros((1, 128), np.int64))],
         "unknown: ['ids']"),
        ("--inputs wrong shape", ["run", gpt, "--inputs", _feeds(p, "shape", x=np.zeros((1, 7), np.int64))],
         "shape [1, 7]"),
        ("--save-outputs into a missing dir", ["run", attn, "--save-outputs", str(p / "nodir" / "o.npz")], "nodir"),
        ("truncated artifact.json", ["run", str(_damaged(p, "attn_s7", _truncate_meta))], "artifact.json is damaged"),
        ("another artifact format", ["run", str(_damaged(p, "attn_s7", _old_format))], "format 0"),
        ("plan without kernels", ["run", str(_damaged(p, "attn_s7", _no_kernels))], "plan.json was changed"),
        ("plan naming foreign primitives", ["run", str(_damaged(p, "attn_s7", _foreign_prims))],
         "plan.json was changed"),
        ("plan.json garbage", ["run", str(_damaged(p, "attn_s7", _garbage_plan))], "plan.json was changed"),
        ("model truncated", ["run", str(_damaged(p, "attn_s7", _truncated_model))], "model.onnx was changed"),
        ("not an artifact", ["run", str(p)], "not a tessera artifact"),
        ("db stats on a text file", ["db", "stats", "--db", str(p / "afile")], "not a tessera tuning database"),
        ("db import of a bad line", ["db", "import", str(p / "afile"), "--db", str(p / "t.db")], "line 1"),
        ("db import of wrong fields", ["db", "import", _jsonl(p, {"a": 1}), "--db", str(p / "t.db")], "KeyError"),
        ("db export under a file", ["db", "export", str(p / "afile" / "x.jsonl"), "--db", str(p / "t.db")], "afile"),
        ("db on a directory", ["db", "stats", "--db", str(p)], "a directory"),
    ]


def _jsonl(p: Path, row: dict) -> str:
    path = p / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return str(path)


def test_the_corpus_is_large_enough(place):
    assert len(_cases(place)) >= 25


@pytest.mark.parametrize("index", range(40))
def test_a_mistake_gets_exit_2_and_one_clear_line(place, capsys, index):
    cases = _cases(place)
    if index >= len(cases):
        pytest.skip("no such case")
    name, argv, says = cases[index]
    mine = (place / "afile").read_text()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, (name, err)
    assert says in err, (name, err)
    assert "Traceback" not in err
    assert (place / "afile").read_text() == mine  # nothing of the user's was overwritten


def test_no_gpu_is_a_clear_error(place, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert main(["run", str(place / "attn_s7"), "--device", "cuda"]) == 2
    assert "no GPU is visible" in capsys.readouterr().err


def test_out_of_memory_is_a_clear_error(place, capsys):
    # A 4 TiB activation: the buffer pool cannot be allocated, and says how much it needed.
    assert main(["compile", str(place / "huge.onnx"), "-o", str(place / "huge"), "--cost", "analytical"]) == 0
    assert main(["run", str(place / "huge")]) == 2
    assert "GiB" in capsys.readouterr().err


def test_python_api_checks_inputs_like_onnxruntime(place):
    import tessera
    from tessera.errors import ShapeError

    exe = tessera.load(place / "gpt2_tiny")
    with pytest.raises(ShapeError, match="holds float32"):
        exe(torch.rand(1, 128))
    with pytest.raises(ShapeError, match="outside"):
        exe(torch.full((1, 128), -1001, dtype=torch.int64))
    (y,) = exe(torch.randint(0, 1000, (1, 128)))[:1]
    assert torch.isfinite(y).all()


def test_no_traceback_reaches_the_terminal(place):
    # The real entry point, as a user runs it.
    r = subprocess.run([sys.executable, "-m", "tessera", "run", str(place / "gpt2_tiny"), "--inputs",
                        _feeds(place, "g", x=np.full((1, 128), 5000))], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_zoo_without_model_packages_says_what_to_install(monkeypatch):
    import builtins

    from tessera import zoo
    from tessera.errors import TesseraError

    real = builtins.__import__

    def no_torchvision(name, *a, **k):
        if name.startswith("torchvision"):
            raise ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    with pytest.raises(TesseraError, match=r"torchvision .*pip install -e '\.\[models\]'"):
        zoo.make("resnet50")


def test_every_file_of_an_artifact_edited_in_turn_is_refused(place, capsys, monkeypatch):
    """Acceptance: edit or remove each file of an artifact in turn; each time a clear error, never a
    run. And loading unpickles nothing."""
    import pickle

    def no_pickle(*a, **k):
        raise AssertionError("an artifact must not be unpickled")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    import tessera

    tessera.load(place / "attn_s7")  # the good one loads
    files = sorted(f.relative_to(place / "attn_s7") for f in (place / "attn_s7").rglob("*") if f.is_file())
    assert {"plan.json", "model.onnx", "artifact.json", "report.html"} <= {str(f) for f in files}
    assert any(str(f).startswith("kernels/") for f in files)
    for rel in files:
        for how in ("edit", "truncate", "remove"):
            a = place / f"edited_{how}"
            if a.exists():
                shutil.rmtree(a)
            shutil.copytree(place / "attn_s7", a)
            f = a / rel
            if how == "edit":
                f.write_bytes(f.read_bytes().replace(b"1", b"2", 1) if b"1" in f.read_bytes() else f.read_bytes() + b" ")
            elif how == "truncate":
                f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
            else:
                f.unlink()
            assert main(["run", str(a)]) == 2, (rel, how)
            err = capsys.readouterr().err
            assert err.startswith("tessera: error:") and err.count("\n") == 1 and "Traceback" not in err, (rel, how, err)


def test_gpu_indices_are_checked_where_they_live():
    # A GPU tensor's indices are checked by a device-side assert (no wait for the GPU each call);
    # on a CPU tensor the same check fails at once, with the message the GPU would report.
    import torch

    from tessera.ir.indices import assert_in_range_async

    assert_in_range_async(torch.tensor([[0, 999, -1000]]), 1000, "ids")
    with pytest.raises(RuntimeError, match=r"input 'ids' holds an index outside \[-1000, 1000\)"):
        assert_in_range_async(torch.tensor([[0, 1000]]), 1000, "ids")
