"""The command line: run, list, targets, certify, defects."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conformance.report import Result, write_report
from conformance.session import Selection, SuiteRun, load_bound_catalog, run_suite, statements
from conformance.spec import SpecError
from conformance.targets import make_target

SYMBOLS = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]", "error": "[red]ERROR[/]", "skip": "[dim]skip[/]",
           "not-observable": "[yellow]n/o[/]", "waived": "[cyan]waived[/]"}
EXIT = {"conformant": 0, "conformant-with-waivers": 0, "non-conformant": 1, "incomplete": 3}
console = Console(stderr=True, highlight=False)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"world sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"world sizes must be positive, got {text!r}")
    return sorted(set(sizes))


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _csv(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _progress(total: int) -> Any:
    done = [0]

    def show(result: Result) -> None:
        done[0] += 1
        head = escape(f"[{done[0]:>3}/{total}] {result.requirement:<28} ws={result.world_size:<2}")
        line = f"{head} {SYMBOLS[result.outcome]}"
        if result.outcome in ("fail", "error"):  # details quote paths like [/x.py:12]: text, not markup
            line += f"  {escape(result.detail[:160])}"
        console.print(line, markup=True)

    return show


def _add_run_args(p: argparse.ArgumentParser, world_sizes: str = "2,4") -> None:
    p.add_argument("--world-sizes", type=_sizes, default=_sizes(world_sizes), help="comma-separated, e.g. 2,4")
    p.add_argument("--report-dir", type=Path, default=Path("reports"), help="where <target>.json/.md go")
    p.add_argument("--area", type=_csv, default=(), help="only these areas (comma-separated)")
    p.add_argument("--requirement", type=_csv, default=(), help="only these requirement ids")
    p.add_argument("--timeout", type=float, default=30.0, help="per-check timeout in seconds")
    p.add_argument("--strict-waivers", action="store_true", help="exit non-zero when a waiver is stale")
    p.add_argument("--launcher", choices=("pool", "env"), default="pool",
                   help="pool: the suite starts its own rank processes; env: this process is one rank of a "
                        "torchrun job (torchrun --nproc-per-node N -m conformance run ... --launcher env)")


def _finish(run: SuiteRun, args: argparse.Namespace) -> int:
    json_path, md_path = write_report(run.report, args.report_dir, statements())
    verdict = run.report["verdict"]
    console.print(f"verdict: [bold]{verdict}[/]  report: {json_path} {md_path}")
    for stale in run.stale:
        console.print(f"[yellow]stale waiver[/]: {escape(str(stale))}")
    for entry in run.out_of_range:
        console.print(f"[yellow]waiver out of range[/]: {escape(entry['message'])}")
    if args.strict_waivers and run.stale:
        return 4
    return EXIT.get(verdict, 1)


def _run_target(target: str, options: dict[str, Any] | None, args: argparse.Namespace) -> int:
    selection = Selection(areas=args.area, ids=args.requirement)
    try:  # bad input is exit 2; errors during the run itself are not
        total = len(selection.pick(load_bound_catalog())) * len(args.world_sizes)
        make_target(target, options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 2
    console.print(f"running {total} cases on target [bold]{target}[/] at world sizes {args.world_sizes}")
    run = run_suite(target, args.world_sizes, selection=selection, target_options=options, timeout_s=args.timeout,
                    progress=_progress(total), launcher=args.launcher)
    if not run.report:  # a non-zero rank of a torchrun job: rank 0 writes the report
        return 0
    return _finish(run, args)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the suite against one target."""
    options = dict(args.target_option)
    return _run_target(args.target, options or None, args)


def cmd_certify(args: argparse.Namespace) -> int:
    """Certify an out-of-tree backend through the vendor target."""
    options = {"backend": args.backend, "device": args.device, "module": args.import_module,
               "package": args.package}
    return _run_target("vendor", options, args)


def cmd_list(args: argparse.Namespace) -> int:
    """List the requirements of the spec."""
    table = Table("id", "level", "area", "capabilities", "statement", show_lines=False)
    for req in load_bound_catalog():
        table.add_row(req.id, req.level, req.area, ",".join(req.capabilities) or "-", req.statement)
    Console(width=200).print(table)
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    """List targets and whether they can run here."""
    from conformance.targets import available_targets, make_target

    for name in available_targets():
        reason = make_target(name).unavailable_reason()
        print(f"{name:<12} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def cmd_defects(args: argparse.Namespace) -> int:
    """Run the defect matrix against the simulator."""
    from conformance.defect_matrix import run_matrix

    return run_matrix(args.world_sizes, args.report_dir, args.timeout, progress=console)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the suite against a target and write a report")
    p.add_argument("--target", required=True, help="sim, gloo, nccl, torchcomms, or a vendor's entry-point name")
    p.add_argument("--target-option", action="append", default=[], metavar="KEY=VALUE", type=_key_value,
                   help="option passed to the target (e.g. path=torchcomms for sim)")
    _add_run_args(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("certify", help="certify an out-of-tree backend (vendor target)")
    p.add_argument("--backend", required=True, help="the name the backend registers")
    p.add_argument("--device", default="cpu", help="device type the backend serves")
    p.add_argument("--import", dest="import_module", required=True, help="module whose import registers it")
    p.add_argument("--package", default=None, help="distribution name, for the report")
    _add_run_args(p)
    p.set_defaults(fn=cmd_certify)
    p = sub.add_parser("list", help="list the requirements")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("targets", help="list the targets and their availability")
    p.set_defaults(fn=cmd_targets)
    p = sub.add_parser("defects", help="run the defect matrix on the simulator")
    p.add_argument("--world-sizes", type=_sizes, default=_sizes("2,4"))
    p.add_argument("--report-dir", type=Path, default=Path("reports"))
    # Above the ~5 s stall some sandboxes add to a store connect: shorter, a slow connect reads as a lost peer.
    p.add_argument("--timeout", type=float, default=8.0, help="per-check timeout; mutants make ranks wait it out")
    p.set_defaults(fn=cmd_defects)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except SpecError as exc:
        console.print(f"[red]error in the spec:[/] {escape(str(exc))}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
