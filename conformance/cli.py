"""The command line: run, list, targets, certify, defects, framework."""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conformance import framework, inputs, interrupts
from conformance.checks.cases import DEFAULT_BUDGET, DEFAULT_SEED, Generation
from conformance.fidelity import cli as fidelity_cli
from conformance.import_probe import probe_import
from conformance.outcomes import Outcome
from conformance.report import Result, with_invocation, write_report
from conformance.report.markdown import WHY
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
from conformance.verdict import ExitCode
from simulator.stacks import STACKS

SYMBOLS = {Outcome.PASS: "[green]pass[/]", Outcome.FAIL: "[red]FAIL[/]", Outcome.ERROR: "[red]ERROR[/]",
           Outcome.SKIP: "[dim]skip[/]", Outcome.NOT_OBSERVABLE: "[yellow]n/o[/]", Outcome.WAIVED: "[cyan]waived[/]"}


console = Console(stderr=True, highlight=False)
T = TypeVar("T")


def _argument(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type`` from an ``inputs`` parser: its InputError becomes argparse's one-line refusal."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except inputs.InputError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


_sizes = _argument(inputs.world_sizes)
_timeout = _argument(inputs.timeout)
_seed = _argument(inputs.seed)
_budget = _argument(inputs.budget)


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


def _add_stack_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", choices=list(STACKS), default="",
                   help="the NCCL stack the simulator models (default: what this torch's 'nccl' means)")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=_seed, default=DEFAULT_SEED,
                   help=f"seed of the generated data cases (default {DEFAULT_SEED}); the report records it")
    p.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET,
                   help=f"random generated cases per plan on top of the boundary ones (default {DEFAULT_BUDGET}; "
                        "0: boundary cases only)")


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
    _add_generation_args(p)


def _invocation(args: argparse.Namespace) -> dict[str, Any]:
    """What the report records of how it was made: the command line, the timeout, the world sizes, and for
    certify the declared capabilities (the verdict depends on them)."""
    invocation: dict[str, Any] = {"command": shlex.join(["python", "-m", "conformance", *args.argv]),
                                  "argv": list(args.argv), "timeout_s": args.timeout,
                                  "world_sizes": list(args.world_sizes)}
    if args.command == "certify":
        invocation |= {"declared_capabilities": list(args.declared.get("capabilities", ())),
                       "options_factory": args.declared.get("options_factory")}
    return invocation


def _finish(run: SuiteRun, args: argparse.Namespace) -> ExitCode:
    run.report = with_invocation(run.report, _invocation(args))
    json_path, md_path = write_report(run.report, args.report_dir, statements())
    verdict = run.report["verdict"]
    judged = run.report["summary"]["judged"]
    console.print(f"judged {judged['judged']} of {judged['backend_musts']} backend MUSTs that apply")
    for why, what in WHY.items():
        ids = [u["requirement"] for u in judged["unjudged"] if u.get("why") == why]
        if ids:
            console.print(f"  not judged, {what}: {', '.join(ids)}", soft_wrap=True)
    if judged.get("not_applicable"):
        ids = ", ".join(n["requirement"] for n in judged["not_applicable"])
        console.print(f"  not applicable to this target: {ids}", soft_wrap=True)
    console.print(f"verdict: [bold]{verdict}[/]  report: {json_path} {md_path}")
    for stale in run.stale:
        console.print(f"[yellow]stale waiver[/]: {escape(stale['message'])}")
    for entry in run.out_of_range:
        console.print(f"[yellow]waiver out of range[/]: {escape(entry['message'])}")
    if args.strict_waivers and run.stale:
        return ExitCode.STALE_WAIVER
    return ExitCode.for_verdict(verdict)


def _run_target(target_name: str, options: dict[str, Any] | None, args: argparse.Namespace) -> ExitCode:
    selection = Selection(areas=args.area, ids=args.requirement)
    try:  # bad input is exit 2, refused before anything runs; errors during the run itself are not
        total = len(selection.pick(load_bound_catalog())) * len(args.world_sizes)
        make_target(target_name, options)
        load_target_expectations(target_name)
        inputs.report_dir(args.report_dir)
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    console.print(f"running {total} cases on target [bold]{target_name}[/] at world sizes {args.world_sizes}")
    run = run_suite(target_name, args.world_sizes, selection=selection, target_options=options, timeout_s=args.timeout,
                    progress=_progress(total), launcher=args.launcher)
    if not run.report:  # a non-zero rank of a torchrun job (rank 0 writes the report), or an interrupted job
        if run.interrupted:
            console.print("interrupted: no report written")
        return ExitCode.INCOMPLETE if run.interrupted else ExitCode.OK
    return _finish(run, args)


def cmd_run(args: argparse.Namespace) -> ExitCode:
    """Run the suite against one target."""
    options = dict(args.target_option)
    if args.stack:
        if args.target != "sim":
            console.print(f"[red]error:[/] --stack chooses the simulator's stack; target {args.target} runs the "
                          "stack it finds (its report's environment.stack names it)")
            return ExitCode.BAD_INPUT
        options["stack"] = args.stack
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
        declared = args.declared = _declared(args)
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


def cmd_coverage(args: argparse.Namespace) -> ExitCode:
    """Print which boundary values of each generated dimension every data check hits."""
    from conformance.checks.coverage import rows

    generation = Generation(args.seed, args.budget)
    table = Table(title=f"generated cases at world size {args.world_size} (--seed {generation.seed} "
                        f"--budget {generation.budget})")
    for column in ("requirement", "plan", "cases", "dimension", "boundary values hit", "missed"):
        table.add_column(column)
    missed_any = False
    for requirement, plan, count, dim, hit, missed in rows(generation, args.world_size):
        missed_any = missed_any or bool(missed)
        table.add_row(requirement, plan, str(count), dim, ", ".join(hit), ", ".join(missed) or "—")
    Console(width=200).print(table)
    return ExitCode.NON_CONFORMANT if missed_any else ExitCode.OK


def cmd_defects(args: argparse.Namespace) -> ExitCode:
    """Run the defect matrix against the simulator."""
    from conformance.defect_matrix import earlier_catches, run_matrix

    try:
        inputs.report_dir(args.report_dir)
        load_bound_catalog()
        if args.order_from is not None and not args.first_catch:
            raise ValueError("--order-from orders --first-catch's cases: give both or neither")
        earlier = earlier_catches(args.order_from) if args.order_from is not None else None
    except ValueError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return ExitCode.BAD_INPUT
    return run_matrix(args.world_sizes, args.report_dir, args.timeout, progress=console, stack=args.stack,
                      first_catch=args.first_catch, earlier=earlier)


class _CertifyHelp(argparse.RawDescriptionHelpFormatter):
    """certify's help: each option's default where it has one, and the capability list as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        if default in (None, False, [], ()) or default is argparse.SUPPRESS or "default" in (action.help or ""):
            return action.help or ""
        shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{action.help} (default: {shown})"


def _capabilities_epilog() -> str:
    """Every capability a backend can declare: what it asks of the backend, the requirements that need it."""
    from conformance.targets.vendor import CONSULTED, CONTRACT, DECLARABLE

    needed_by: dict[str, list[str]] = {c: [] for c in DECLARABLE}
    try:
        catalog = load_bound_catalog()
    except SpecError:  # the command itself reports it, as its one line and exit 2
        catalog = []
    for req in catalog:
        for cap in req.capabilities:
            needed_by.get(cap, []).append(req.id)
    wrap = textwrap.TextWrapper(width=100, initial_indent="    ", subsequent_indent="    ",
                                break_on_hyphens=False)
    lines = ["capabilities (--capability NAME,... or capabilities = [...] in --capabilities-file); each is verified,",
             "not trusted. Not declared, its requirements stay unjudged (listed in the report), never failed.",
             "Guide: docs/vendor-guide.md."]
    for cap in DECLARABLE:
        lines += [f"  {cap}", *wrap.wrap(f"asks: {CONTRACT[cap]}")]
        lines += wrap.wrap(f"needed by: {', '.join(needed_by[cap]) or 'no requirement alone'}")
        lines += wrap.wrap(f"also: {CONSULTED[cap]}") if cap in CONSULTED else []
    return "\n".join(lines)


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
                   help="option passed to the target (e.g. defects=barrier_no_wait for sim)")
    _add_stack_arg(p)
    _add_run_args(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("certify", help="certify an out-of-tree backend (vendor target)",
                       formatter_class=_CertifyHelp, epilog=_capabilities_epilog(),
                       description="Certify an out-of-tree backend: import --import in every rank, run each "
                                   "requirement at each world size, write <backend>.json and <backend>.md. "
                                   "Guide: docs/vendor-guide.md.")
    p.add_argument("--backend", required=True, help="the name the backend registers")
    p.add_argument("--device", default="cpu", help="device type the backend serves")
    p.add_argument("--import", dest="import_module", required=True, help="module whose import registers it")
    p.add_argument("--package", default=None, help="distribution name, for the report")
    p.add_argument("--capability", action="append", type=_csv, default=[], metavar="NAME[,NAME...]",
                   help="a capability the backend declares (the list below); checks needing it run, and a "
                        "skip among them is a failure")
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
    p.add_argument("--first-catch", action="store_true",
                   help="only the cases that can still change a verdict (a defect not yet caught, a requirement "
                        "without teeth yet): the same three verdicts, partial 'caught by' lists")
    p.add_argument("--order-from", type=Path, default=None, metavar="DEFECTS_JSON",
                   help="with --first-catch: run each defect first against the requirements that caught it in "
                        "this earlier matrix (e.g. reports/defects.json); the order changes no verdict")
    _add_stack_arg(p)
    _add_generation_args(p)
    p.set_defaults(fn=cmd_defects)
    p = sub.add_parser("coverage", help="print which boundary values of each generated dimension every check hits")
    p.add_argument("--world-size", type=int, default=4, choices=range(2, inputs.MAX_WORLD_SIZE + 1),
                   metavar="N", help="world size the cases are generated for (default 4)")
    _add_generation_args(p)
    p.set_defaults(fn=cmd_coverage)
    p = sub.add_parser("framework", help="run a framework's group builder on the simulator and judge its groups")
    framework.add_arguments(p)
    p.set_defaults(fn=framework.cmd_framework)
    p = sub.add_parser("fidelity", help="run torch's own distributed tests on gloo and the simulator, side by side")
    fidelity_cli.add_arguments(p)
    p.set_defaults(fn=fidelity_cli.cmd_fidelity)
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
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.command in ("run", "certify", "defects", "mutate"):
        interrupts.install()  # SIGTERM stops a run as Ctrl-C does; a second signal never breaks the cleanup
    try:
        if args.command in ("run", "certify", "defects"):
            with Generation(args.seed, args.budget).exported():  # the rank processes inherit it
                return args.fn(args)
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
