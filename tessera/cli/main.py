"""The `tessera` command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from tessera.errors import TesseraError
from tessera.summary import format_summary, summarize
from tessera.tolerance import TOLERANCE
from tessera.verify import STAGES, verify


def parse_input_shapes(specs: Sequence[str] | None) -> dict[str, tuple[int, ...]]:
    """`name=1x3x224x224` pairs -> {name: shape}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
            if any(d < 0 for d in shapes[name]):
                raise ValueError
        except ValueError:
            raise TesseraError(f"--input-shape '{spec}' is not NAME=DIMS, e.g. x=1x3x224x224") from None
    return shapes


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="fix an input's shape, e.g. x=1x3x224x224 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera", description="A compiler for deep-learning inference on NVIDIA GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("inspect", help="operator and primitive counts, opaque ops, folded constants")
    _add_model_args(p)
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("verify", help="compare a stage with onnxruntime on random inputs")
    _add_model_args(p)
    p.add_argument("--stage", choices=STAGES, default="fission")
    p.add_argument("--seed", type=int, help="random seed (default: fresh)")
    p.add_argument("--precision", choices=sorted(TOLERANCE), default="fp32", help="tolerance to apply")
    p.add_argument("--json", action="store_true", help="print JSON")
    return parser


def cmd_inspect(args: argparse.Namespace) -> int:
    s = summarize(args.model, parse_input_shapes(args.input_shape))
    print(json.dumps(s, indent=2) if args.json else format_summary(s))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    r = verify(args.model, stage=args.stage, input_shapes=parse_input_shapes(args.input_shape),
               seed=args.seed, precision=args.precision)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
    else:
        print(f"{r.model}: stage {r.stage} vs onnxruntime, seed {r.seed}, "
              f"tolerance {TOLERANCE[r.precision]:g} ({r.precision}), {r.seconds:.1f}s")
        for o in r.outputs:
            print(f"  {o.name:<24} {str(list(o.shape)):<20} rel L2 {o.rel_l2:.3e}  {'PASS' if o.passed else 'FAIL'}")
        if r.opaque:
            print(f"  {len(r.opaque)} opaque node(s) ran through onnxruntime: "
                  + ", ".join(f"{o.node} ({o.op_type})" for o in r.opaque))
        print("PASS" if r.passed else "FAIL")
    return 0 if r.passed else 1


COMMANDS = {"inspect": cmd_inspect, "verify": cmd_verify}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except TesseraError as e:
        print(f"tessera: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tessera: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
