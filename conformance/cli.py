"""The command line: run, list, targets, certify, defects, framework."""

from __future__ import annotations

import argparse
import enum
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conformance import framework, inputs, interrupts
from conformance.import_probe import probe_import
from conformance.outcomes import Outcome
from conformance.report import Result, Verdict, write_report
from conformance.session import (
    Selection,
    SuiteRun,
    load_bound_catalog,
    load_target_expectations,
    run_suite,
    statements,
)
from conformance.spec import SpecError
from conformance.targets import make_target

SYMBOLS = {Outcome.PASS: "[green]pass[/]", Outcome.FAIL: "[red]FAIL[/]", Outcome.ERROR: "[red]ERROR[/]",
           Outcome.SKIP: "[dim]skip[/]", Outcome.NOT_OBSERVABLE: "[yellow]n/o[/]", Outcome.WAIVED: "[cyan]waived[/]"}


class ExitCode(enum.IntEnum):
    """What ``python -m conformance`` exits with."""

    OK = 0  # conformant, conformant-with-waivers, or a command with nothing to judge
    NON_CONFORMANT = 1  # a MUST failed (or, for `defects`, a target of the matrix was missed)
    BAD_INPUT = 2  # refused before anything ran
    INCOMPLETE = 3  # interrupted, or no MUST could be judged
    STALE_WAIVER = 4  # --strict-waivers found a waiver whose requirement now passes

    @classmethod
    def for_verdict(cls, verdict: str) -> ExitCode:
        """The exit code of a report's verdict."""
        return {Verdict.CONFORMANT: cls.OK, Verdict.CONFORMANT_WITH_WAIVERS: cls.OK,
                Verdict.INCOMPLETE: cls.INCOMPLETE}.get(verdict, cls.NON_CONFORMANT)

console = Console(stderr=True, highlight=False)


def _sizes(text: str) -> list[int]:
    try:
        return inputs.world_sizes(text)
    except inputs.InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _timeout(text: str) -> float:
    try:
        return inputs.timeout(text)
    except inputs.InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line naming the value, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message}\n")


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
        if result.outcome.failing:  # details quote paths like [/x.py:12]: text, not markup
            line += f"  {escape(result.detail[:160])}"
        console.print(line, markup=True)

    return show


def _add_run_args(p: argparse.ArgumentParser, world_sizes: str = "2,4") -> None:
    p.add_argument("--world-sizes", type=_sizes, default=_sizes(world_sizes), help="comma-separated, e.g. 2,4")
    p.add_argument("--report-dir", type=Path, default=Path("reports"), help="where <target>.json/.md go")
    p.add_argument("--area", type=_csv, default=(), help="only these areas (comma-separated)")
    p.add_argument("--requirement", type=_csv, default=(), help="only these requirement ids")
    p.add_argument("--timeout", type=_timeout, default=30.0, help="per-check timeout in seconds")
    p.add_argument("--strict-waivers", action="store_true", help="exit non-zero when a waiver is stale")
    p.add_argument("--launcher", choices=("pool", "env"), default="pool",
                   help="pool: the suite starts its own rank processes; env: this process is one rank of a "
                        "torchrun job (torchrun --nproc-per-node N -m conformance run ... --launcher env)")


def _finish(run: SuiteRun, args: argparse.Namespace) -> ExitCode:
    json_path, md_path = write_report(run.report, args.report_dir, statements())
    verdict = run.report["verdict"]
    judged = run.report["summary"]["judged"]
    console.print(f"judged {judged['judged']} of {judged['backend_musts']} backend MUSTs"
                  + (f"; not judged: {', '.join(u['requirement'] for u in judged['unjudged'])}"
                     if judged["unjudged"] else ""))
    console.print(f"verdict: [bold]{verdict}[/]  report: {json_path} {md_path}")
    for stale in run.stale:
        console.print(f"[yellow]stale waiver[/]: {escape(stale['message'])}")
    for entry in run.out_of_range:
        console.print(f"[yellow]waiver out of range[/]: {escape(entry['message'])}")
    if args.strict_waivers and run.stale:
        return ExitCode.STALE_WAIVER
    return ExitCode.for_verdict(verdict)


def _run_target(target: str, options: dict[str, Any] | None, args: argparse.Namespace) -> ExitCode:
    selection = Selection(areas=args.area, ids=args.requirement)
    try:  # bad input is exit 2, refused before anything runs; errors during the run itself are not
        total = len(selection.pick(load_bound_catalog())) * len(args.world_sizes)
        make_target(target, options)
        load_target_expectations(target)
        inputs.report_dir(args.report_dir)
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    console.print(f"running {total} cases on target [bold]{target}[/] at world sizes {args.world_sizes}")
    run = run_suite(target, args.world_sizes, selection=selection, target_options=options, timeout_s=args.timeout,
                    progress=_progress(total), launcher=args.launcher)
    if not run.report:  # a non-zero rank of a torchrun job (rank 0 writes the report), or an interrupted job
        if run.interrupted:
            console.print("interrupted: no report written")
        return ExitCode.INCOMPLETE if run.interrupted else ExitCode.OK
    return _finish(run, args)


def cmd_run(args: argparse.Namespace) -> ExitCode:
    """Run the suite against one target."""
    options = dict(args.target_option)
    return _run_target(args.target, options or None, args)


def _declared(args: argparse.Namespace) -> dict[str, Any]:
    """Capabilities and options factory from --capability/--options-factory and --capabilities-file."""
    declared: dict[str, Any] = {}
    if args.capabilities_file is not None:
        try:
            declared = tomllib.loads(args.capabilities_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"--capabilities-file {args.capabilities_file}: {exc}") from None
        unknown = sorted(set(declared) - {"capabilities", "options_factory"})
        if unknown:
            raise ValueError(f"--capabilities-file {args.capabilities_file}: unknown keys {unknown}; "
                             "expected capabilities = [...] and options_factory = \"MODULE:FUNCTION\"")
    caps = [*declared.get("capabilities", ()), *(c for group in args.capability for c in group)]
    factory = args.options_factory or declared.get("options_factory")
    return {"capabilities": sorted(set(caps))} | ({"options_factory": factory} if factory else {})


def cmd_certify(args: argparse.Namespace) -> ExitCode:
    """Certify an out-of-tree backend through the vendor target."""
    try:
        declared = _declared(args)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return ExitCode.BAD_INPUT
    options = {"backend": args.backend, "device": args.device, "module": args.import_module,
               "package": args.package, **declared}
    problem = probe_import(args.import_module, args.backend, args.timeout)  # a hang or crash stays out of here
    if interrupts.requested():  # the Ctrl-C reached the probe too: not the module's fault
        console.print("interrupted: nothing run, no report written")
        return ExitCode.INCOMPLETE
    if problem:
        console.print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    return _run_target("vendor", options, args)


def cmd_list(args: argparse.Namespace) -> ExitCode:
    """List the requirements of the spec."""
    table = Table("id", "level", "area", "capabilities", "statement", show_lines=False)
    for req in load_bound_catalog():
        table.add_row(req.id, req.level, req.area, ",".join(req.capabilities) or "-", req.statement)
    Console(width=200).print(table)
    return ExitCode.OK


def cmd_targets(args: argparse.Namespace) -> ExitCode:
    """List targets and whether they can run here."""
    from conformance.targets import available_targets, make_target

    for name in available_targets():
        reason = make_target(name).unavailable_reason()
        print(f"{name:<12} {'available' if reason is None else 'unavailable: ' + reason}")
    return ExitCode.OK


def cmd_defects(args: argparse.Namespace) -> ExitCode:
    """Run the defect matrix against the simulator."""
    from conformance.defect_matrix import run_matrix

    try:
        inputs.report_dir(args.report_dir)
        load_bound_catalog()
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    return run_matrix(args.world_sizes, args.report_dir, args.timeout, progress=console)


def cmd_mutate(args: argparse.Namespace) -> ExitCode:
    """Mutation testing: judge generated mutants of the simulator and of toyccl (conformance.mutation)."""
    from conformance.mutation.command import cmd_mutate as mutate

    try:
        return ExitCode(mutate(args, say=lambda text: console.print(text, markup=False, emoji=False, soft_wrap=True)))
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT


def build_parser() -> argparse.ArgumentParser:
    """The argument parser."""
    parser = _Parser(prog="python -m conformance", description=__doc__)
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
    p.add_argument("--capability", action="append", type=_csv, default=[], metavar="NAME[,NAME...]",
                   help="a capability the backend declares (split, options, hints, device_binding, p2p_tags, "
                        "p2p_any_source, ...); checks needing it run, and a skip among them is a failure")
    p.add_argument("--capabilities-file", type=Path, default=None, metavar="FILE.toml",
                   help="TOML with capabilities = [...] and optionally options_factory = \"MODULE:FUNCTION\"")
    p.add_argument("--options-factory", default=None, metavar="MODULE:FUNCTION",
                   help="makes the backend's options object from NCCL-style fields and hints={...} "
                        "(default: the module's conformance_make_options)")
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
    p.add_argument("--timeout", type=_timeout, default=8.0, help="per-check timeout; mutants make ranks wait it out")
    p.set_defaults(fn=cmd_defects)
    p = sub.add_parser("framework", help="run a framework's group builder on the simulator and judge its groups")
    framework.add_arguments(p)
    p.set_defaults(fn=framework.cmd_framework)
    p = sub.add_parser("mutate", help="mutation testing: judge generated mutants of the simulator and of toyccl")
    from conformance.mutation.command import add_arguments as mutate_arguments

    mutate_arguments(p)
    p.set_defaults(fn=cmd_mutate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point. Called with ``argv`` (in-process), the previous signal handlers are restored at the end;
    as the process's entry point (no ``argv``), SIGINT and SIGTERM are ignored from then on: a late second
    Ctrl-C must not turn the exit status of a run that stopped cleanly into a death by signal."""
    args = build_parser().parse_args(argv)
    if args.command in ("run", "certify", "defects", "mutate"):
        interrupts.install()  # SIGTERM stops a run as Ctrl-C does; a second signal never breaks the cleanup
    try:
        return args.fn(args)
    except SpecError as exc:
        console.print(f"[red]error in the spec:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    finally:
        if argv is not None:
            interrupts.uninstall()
        elif interrupts.installed():
            interrupts.ignore_from_now()


if __name__ == "__main__":
    sys.exit(main())
