"""The `rollout-bench` command line."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from bench import __version__
from bench.arguments import ArgumentError, int_at_least, non_negative, port, positive_seconds, share
from bench.trace.shipped import DEFAULT_TRACE, SHIPPED_TRACES, resolve_trace, shipped_trace

CONTROL_TOKEN_ENV = "ROLLOUT_BENCH_CONTROL_TOKEN"


def _cmd_synth(args: argparse.Namespace) -> int:
    from bench.arguments import check_output_file
    from bench.synth import synthesize

    check_output_file("--out", args.out)  # before any work: a folder that is missing, a file that is a folder
    print(f"synth: kind={args.kind} n={args.n} seed={args.seed}", file=sys.stderr)
    path = synthesize(args.kind, args.n, args.seed, args.out, group_size=args.group_size,
                      context_length=args.context_length, created=args.created, show_progress=True,
                      turns=args.turns, tool_output_tokens=args.tool_output_tokens)
    print(f"wrote {args.n} {args.kind} trajectories to {path} (seed {args.seed})")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from bench.trace import validate_trace

    failed = False
    for spec in args.files:
        count = 0
        for problem in validate_trace(resolve_trace(spec)):
            print(problem)
            count += 1
        failed = failed or count > 0
        print(f"{spec}: {count} problem{'s' if count != 1 else ''}" if count else f"{spec}: valid", file=sys.stderr)
    return 1 if failed else 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from bench.trace.stats import format_summary, write_trace_report

    path = resolve_trace(args.trace)
    out = Path(args.out) if args.out else Path("reports") / f"inspect-{path.name.split('.')[0]}"
    summary = write_trace_report(path, out, show_progress=True)
    print(format_summary(summary))
    print(f"report: {out.resolve()}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from bench.server.serve import serve

    plan = build_plan(args.plan, args.fault, args.seed)
    return asyncio.run(serve(args.trace, host=args.host, port=args.port, log_dir=args.log_dir, plan=plan,
                             sglang_version=args.sglang_version, time_scale=args.time_scale,
                             router_version=args.router_version, openai_flavor=args.openai_flavor,
                             incremental_streaming=args.incremental_streaming_output, tokenizer_dir=args.tokenizer,
                             engine=args.sglang_build, control_token=args.control_token, limits=_limits(args)))


def _limit_arguments(parser: argparse.ArgumentParser) -> None:
    from bench.server.limits import SERVE_KEEP_REQUESTS, Limits

    parser.add_argument("--max-body-mb", type=float, default=Limits.max_body_mb,
                        help=f"largest request body accepted, in MB (413 beyond; default {Limits.max_body_mb:g})")
    parser.add_argument("--head-timeout", type=float, default=Limits.head_timeout_s, metavar="S",
                        help="seconds a request head (or an idle keep-alive connection) may take before the connection "
                        f"is closed (default {Limits.head_timeout_s:g})")
    parser.add_argument("--body-timeout", type=float, default=Limits.body_timeout_s, metavar="S",
                        help=f"seconds a request body may take once its head is in (408 beyond; default "
                        f"{Limits.body_timeout_s:g})")
    parser.add_argument("--max-connections", type=int, default=Limits.max_connections,
                        help=f"open connections at once; more are closed as they arrive (default {Limits.max_connections})")
    parser.add_argument("--max-n", type=int, default=Limits.max_n,
                        help=f"samples one request may ask for (n; 400 beyond; default {Limits.max_n})")
    parser.add_argument("--keep-requests", type=int, default=SERVE_KEEP_REQUESTS, metavar="N",
                        help="requests whose log rows and served tokens stay in memory (default "
                        f"{SERVE_KEEP_REQUESTS}); older log rows "
                        "spill to --log-dir and end up in its requests.csv (without --log-dir they are dropped)")


def _limits(args: argparse.Namespace) -> Any:
    from bench.server.limits import Limits

    try:
        return Limits(args.max_body_mb, args.head_timeout, args.body_timeout, args.max_connections, args.max_n,
                      args.keep_requests)
    except ValueError as error:  # the field's name, as the option a user typed
        message = str(error)
        for field, option in (("max_body_mb", "--max-body-mb"), ("head_timeout_s", "--head-timeout"),
                              ("body_timeout_s", "--body-timeout"), ("max_connections", "--max-connections"),
                              ("max_n", "--max-n"), ("keep_requests", "--keep-requests")):
            message = message.replace(field, option)
        raise ValueError(message) from None


def _control_token_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--control-token", default=os.environ.get(CONTROL_TOKEN_ENV) or None,
                        help=f"the token /bench/* requires (default ${CONTROL_TOKEN_ENV}; bound beyond loopback "
                        "without one, a token is generated and printed at start)")


def _cmd_proxy(args: argparse.Namespace) -> int:
    import asyncio

    from bench.server.proxy import proxy

    plan = build_plan(args.plan, args.fault, args.seed)
    options = {"openai_flavor": args.openai_flavor} if args.openai_flavor else {}
    return asyncio.run(proxy(args.upstream, host=args.host, port=args.port, log_dir=args.log_dir, plan=plan,
                             trace=args.trace, tokenizer_dir=args.tokenizer, context_length=args.context_length,
                             sglang_version=args.sglang_version, router_version=args.router_version,
                             control_token=args.control_token, limits=_limits(args), **options))


def _cmd_record(args: argparse.Namespace) -> int:
    import asyncio

    from bench.capture.serve_recorder import record
    from bench.capture.upstream import UpstreamError

    if args.context_length is not None and args.context_length <= 0:
        raise ValueError(f"--context-length must be positive, got {args.context_length}")
    try:
        asyncio.run(record(args.upstream, args.out, host=args.host, port=args.port, redact_text=args.redact_text,
                           force=args.force, tokenizer_dir=args.tokenizer, context_length=args.context_length))
    except (UpstreamError, FileExistsError) as error:
        print(f"rollout-bench record: error: {error}", file=sys.stderr)
        return 2
    return 0


NO_PLAN = "none"  # `--plan none`: replay the trace with no faults (e.g. to check an imported trace replays)


def build_plan(plan_spec: str | None, fault_specs: list[str] | None, seed: int | None):  # type: ignore[no-untyped-def]
    """The run's fault plan: a plan file or shipped name, plus `--fault` rules; `--seed` overrides."""
    from faults import Plan, plan_from_specs, resolve_plan

    plan = resolve_plan(plan_spec) if plan_spec and plan_spec != NO_PLAN else None
    extra = plan_from_specs(fault_specs or [], seed if seed is not None else (plan.seed if plan else 0))
    if plan is None:
        return extra if fault_specs else None
    combined = Plan(plan.name, plan.seed, plan.rules + extra.rules, plan.description, plan.source, plan.window_from)
    return combined.with_seed(seed) if seed is not None else combined


def _cmd_faults(args: argparse.Namespace) -> int:
    import dataclasses

    from faults import FAULTS, fault_class, shipped_plans

    fault_class("abort")  # registers the catalogue
    for name, cls in sorted(FAULTS.items()):
        params = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().splitlines()[0]
        print(f"{name:<28} {cls.category:<9} {params}")
        print(f"{'':<28} {doc.removeprefix(f'`{name}`: ')}")
    print("\nshipped plans: " + ", ".join(shipped_plans()))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses
    import time

    from bench.arguments import check_invariant_names, check_output_file, check_report_folder

    if os.environ.pop("ROLLOUT_BENCH_STDIN_LIFELINE", None):  # a sweep's run: end with the sweep
        from bench.isolation.lifeline import die_with_stdin

        die_with_stdin()
    # every argument and output path is checked before anything starts (a worker, a server, a trace load)
    out = check_report_folder("--out", args.out or Path("reports") / time.strftime("run-%Y%m%d-%H%M%S"), args.force)
    if args.junit:
        check_output_file("--junit", args.junit, creates_folder=True)
    invariants = check_invariant_names("--invariants", args.invariants) if args.invariants else None
    from bench.invariants import Bounds
    from bench.orchestration.repro import load_repro
    from bench.orchestration.runner import DEFAULT_PLAN, RunConfig, run
    from bench.targets import DEFAULT_TARGET

    # a repro file records every input of its run: only what is given on this command line overrides it
    options: dict[str, Any] = {key: value for key, value in (
        ("concurrency", args.concurrency), ("time_scale", args.time_scale), ("watchdog_s", args.watchdog),
        ("deadline_s", args.deadline)) if value is not None}
    if args.invariants:
        options["invariants"] = invariants
    bounds = {key: value for key, value in (("max_weight_lag", args.max_weight_lag),
                                            ("max_requests_per_trajectory", args.max_requests),
                                            ("run_budget_s", args.budget),
                                            ("max_drift_share", args.max_drift_share)) if value is not None}
    if args.python:
        options["python"] = args.python
    if args.in_process:
        options["isolation"] = "inline"
    if args.cold:
        options["warm"] = False
    if args.known:
        options["known"] = args.known
    if args.upstream:
        options["upstream"] = args.upstream
    if args.tokenizer:
        options["tokenizer_dir"] = args.tokenizer
    if args.steps is not None:
        options["steps"] = args.steps
    if args.on_step_failure is not None:
        options["on_step_failure"] = args.on_step_failure
    if args.compare_fresh:
        options["compare_fresh"] = True
    target_options = _target_options(args)
    if args.repro:
        if args.plan or args.fault or args.n is not None or args.trace != DEFAULT_TRACE:
            whole = Path(args.repro).name == "run.toml"  # already the whole run's file: nothing bigger to rerun
            raise ValueError("--repro replays the trajectories, trace and rules its file recorded: --plan, --fault, "
                             "--n and --trace do not apply (edit the file"
                             + (")" if whole else ", or rerun its run.toml)"))
        if args.target:
            options["target"] = args.target  # the same failure against another variant: your fix
        config = load_repro(args.repro, **options).config
        from bench.orchestration.trust import check_repro

        for line in check_repro(None if args.target else config.target,  # given on this command line: the user's
                                None if args.python else config.python, trust=args.trust_plugin):
            print(line, flush=True)
        config.target_options = {**config.target_options, **target_options}
        if bounds:
            config.bounds = dataclasses.replace(config.bounds, **bounds)
        if args.seed is not None and config.plan is not None:
            config.plan = config.plan.with_seed(args.seed)
    else:
        plan = build_plan(args.plan if (args.plan or args.fault) else DEFAULT_PLAN, args.fault, args.seed)
        options.setdefault("time_scale", 0.05)  # the command line replays at 1/20 speed (RunConfig: as fast as possible)
        config = RunConfig(trace=args.trace, plan=plan, target=args.target or DEFAULT_TARGET, n=args.n,
                           target_options=target_options, bounds=Bounds(**bounds), **options)
    plan = config.plan
    print(f"run: trace={config.trace} target={config.target} plan={plan.name if plan else None} "
          f"seed={plan.seed if plan else None}", file=sys.stderr)
    signalled: list[int] = []  # the signals that arrived during the run
    try:
        result = asyncio.run(_until_signalled(
            lambda interrupt: run(config, show_progress=True, while_starting=_load_report_writer, interrupt=interrupt),
            signalled))
    except _Terminated as stop:
        print(f"run: stopped by a second {stop.name}; the worker, its process group and escapees were killed, "
              "no report written", file=sys.stderr)
        return 128 + stop.signum
    previous = _raise_on_sigterm()  # from here on (report, repros) SIGTERM ends the command the way Ctrl-C does
    try:
        return _report_and_repros(args, result, out, signalled)
    finally:
        import signal

        signal.signal(signal.SIGTERM, previous)


def _report_and_repros(args: argparse.Namespace, result: Any, out: Path, signalled: list[int]) -> int:
    """Write the run's report; after a failing run that was not interrupted, its verified repros."""
    from bench.orchestration.repro import Budget, write_config, write_repros
    from bench.report import add_to_summary, format_summary, write_report

    try:
        summary = write_report(result, out, junit=args.junit)
    except OSError as error:  # a full disk, a file size limit: each file is whole or absent, the message names it
        verdict = "passed" if result.ok else f"found {len(result.violations)} violation(s)"
        print(f"rollout-bench: error: {error}; the report in {out} is incomplete (files written before it are whole, "
              f"nothing is half-written); the run itself {verdict}", file=sys.stderr)
        return 2
    print(format_summary(summary, str(out.resolve())))
    print(f"report: {out.resolve()}")
    if args.n is not None and args.n > len(result.records) and not result.interrupted:
        print(f"run: --n {args.n}, but the trace has {len(result.records)} trajectories: all of them ran",
              file=sys.stderr)
    if signalled:
        name = _signal_name(signalled[0])
        write_config(result.config, out / "run.toml", result=result)
        print(f"run: {'interrupted' if result.interrupted else 'finished, then got'} {name}: the report holds "
              f"what came back until then{' (marked interrupted)' if result.interrupted else ''}; no repros",
              file=sys.stderr)
        return 128 + signalled[0]
    if result.violations and args.repro_reruns > 0:
        print(f"repros: rerunning to verify{' and shrink' if result.config.steps == 1 else ''} each failure (at most "
              f"{args.repro_reruns} reruns each)",
              file=sys.stderr, flush=True)
        outcomes = write_repros(result, out, budget=Budget(reruns=args.repro_reruns))
        add_to_summary(out, "repros", [o.to_dict() for o in outcomes])
        for line in _repro_lines([o.to_dict() for o in outcomes]):
            print(line)
    else:
        write_config(result.config, out / "run.toml", result=result)
    _suggest_warm_worker(result.worker)
    return 0 if result.ok else 1


class _Terminated(BaseException):
    """A signal that ends `rollout-bench run` without a report (a second SIGINT/SIGTERM during the run, or
    SIGTERM once the report is written). A BaseException, as KeyboardInterrupt: no `except Exception` stops it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = _signal_name(signum)


def _signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def _raise_on_sigterm() -> Any:
    """SIGTERM raises `_Terminated` (the previous handler is returned, to restore)."""
    import signal

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(signum)

    return signal.signal(signal.SIGTERM, handler)


async def _until_signalled(work: Callable[[Any], Any], signalled: list[int]) -> Any:
    """Run `work(interrupt)`. The first SIGINT or SIGTERM sets the interrupt: the run stops waiting for its
    target, kills the worker, and returns what it gathered, for a report marked interrupted. A second one
    cancels it outright (its worker's process group killed, `IsolatedTarget` on cancel): no report."""
    import asyncio
    import signal

    from bench.orchestration.interrupt import Interrupt

    interrupt = Interrupt()
    task = asyncio.ensure_future(work(interrupt))

    def on_signal(signum: int) -> None:
        signalled.append(signum)
        if len(signalled) == 1:
            print(f"\nrun: {_signal_name(signum)}: stopping the target and writing the report of what came back "
                  "(again to stop at once, without a report)", file=sys.stderr, flush=True)
            interrupt.set(_signal_name(signum))
        else:
            task.cancel()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if len(signalled) > 1:
            raise _Terminated(signalled[-1]) from None
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


def _suggest_warm_worker(worker: dict[str, Any] | None, slow_s: float = 5.0) -> None:
    """After a run whose worker spent seconds importing the target: say how to pay that only once."""
    if not worker or worker.get("forked_from_warm") or (worker.get("startup_s") or 0.0) < slow_s:
        return
    framework = str(worker["spec"]).split(":", 1)[0]
    note = f" ({worker['warm_note']})" if worker.get("warm_note") else ""
    print(f"note: the worker took {worker['startup_s']:.1f} s to start and import {framework}{note}; "
          f"`rollout-bench worker --target {framework} --detach` keeps it imported and later runs fork from it",
          file=sys.stderr)


def _load_report_writer() -> None:
    """Import the report writer (pandas, matplotlib) and draw once, while the run's worker starts."""
    from bench.report import plots

    plots.warm_up()


def _target_options(args: argparse.Namespace) -> dict[str, Any]:
    """`--target-option key=value` (values parsed as JSON when they are) plus the named target flags."""
    import json

    options: dict[str, Any] = {}
    for item in args.target_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--target-option {item!r}: expected KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    if getattr(args, "slime_path", None) and getattr(args, "source", None) and args.slime_path != args.source:
        raise ValueError("--slime-path is --source's older name: give one of them")
    source = getattr(args, "source", None) or getattr(args, "slime_path", None)
    if source:
        options["source"] = source
    for key in ("custom_generate_function_path", "custom_rm_path", "mode"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    return options


def _cmd_worker(args: argparse.Namespace) -> int:
    """Start (or stop) a warm worker: the target imported once, each run of it forked from there."""
    import signal
    import subprocess

    from bench.isolation.process import worker_env
    from bench.isolation.warm_client import default_log, running_warm, socket_path, start_warm, stop_warm
    from bench.targets import check_target_spec
    from bench.targets.frameworks.envs import target_python

    check_target_spec(args.target)
    python = args.python or target_python(args.target) or sys.executable
    path = socket_path(python, args.target)
    if args.stop:
        pid = stop_warm(python, args.target)
        print(f"stopped the warm worker for {args.target} (pid {pid})" if pid is not None
              else f"no warm worker for {args.target} under {python}")
        return 0
    pid = running_warm(python, args.target)
    if pid is not None:
        print(f"a warm worker for {args.target} already runs (pid {pid}, socket {path}); "
              f"stop it with: rollout-bench worker --target {args.target} --stop")
        return 0
    log = Path(args.log) if args.log else default_log(python, args.target)
    process, ready = start_warm(python, args.target, _target_options(args), args.idle_timeout, worker_env(python), log)
    print(f"warm worker for {ready['target']} ready: pid {ready['pid']}, {python}, socket {path}, log {log}\n"
          f"runs of {args.target.split(':')[0]} under this interpreter now fork from it (`run --cold` to opt out); "
          f"it exits when an imported file changes, after {args.idle_timeout:g} s without a run, or on "
          f"`rollout-bench worker --target {args.target} --stop`", flush=True)
    if args.detach:
        return 0
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from bench.orchestration.known import resolve_known
    from bench.sweep.sweeper import SweepOptions, default_jobs, sweep_command, sweep_invariants

    if args.resume and args.out and Path(args.out).resolve() != Path(args.resume).resolve():
        raise ValueError(f"--out {args.out} with --resume {args.resume}: a resumed sweep writes into its own folder")
    if not args.resume and not args.out:
        raise ValueError("--out: required (or --resume DIR to finish a sweep)")
    # a bad known-findings file fails here, not in every run; each run gets the file's absolute path
    known = ["--known", str(resolve_known(args.known)[0].resolve())] if args.known else []
    run_args = (["--python", args.python] if args.python else []) + (["--in-process"] if args.in_process else []) \
        + known
    # what this command sets (a resumed sweep takes the rest from its record, and refuses other values)
    given = {key: value for key, value in (
        ("trace", args.trace), ("n", args.n), ("time_scale", args.time_scale), ("concurrency", args.concurrency),
        ("watchdog_s", args.watchdog), ("timeout_s", args.timeout),
        ("invariants", None if args.invariants is None else sweep_invariants(args.invariants)),
        ("steps", args.steps), ("on_step_failure", args.on_step_failure), ("compare_fresh", args.compare_fresh or None),
        ("run_args", tuple(run_args) or None), ("jobs", args.jobs)) if value is not None}
    options = SweepOptions(**{"invariants": sweep_invariants(None), "jobs": default_jobs(), **given})
    import signal

    previous = _raise_on_sigterm()  # SIGTERM ends the sweep as Ctrl-C does: runs stopped, sweep.json interrupted
    try:
        return sweep_command(args.plan, args.target, args.rates, args.seeds, args.resume or args.out, options,
                             shard=args.shard, resume=bool(args.resume), given=frozenset(given),
                             ray_address=args.ray)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _cmd_report(args: argparse.Namespace) -> int:
    from bench.report import format_summary, load_sweep, rerender
    from bench.sweep.liveness import sweep_status_note
    from bench.sweep.table import is_sweep_folder

    if is_sweep_folder(args.folder):  # a sweep: one line per run, as its table has them
        runs = load_sweep(args.folder)["runs"]
        columns = [c for c in ("plan", "target", "rate", "seed", "outcome", "drop_rate", "violations", "steps_ran",
                               "first_violation_step") if c in runs]
        print(runs[columns].to_string(index=False))
        print(f"sweep: {Path(args.folder).resolve()} ({len(runs)} runs)")
        note = sweep_status_note(load_sweep(args.folder)["summary"])
        if note:
            print(f"sweep: {note}", file=sys.stderr)
        return 0
    summary = rerender(args.folder)
    print(format_summary(summary, str(Path(args.folder).resolve())))
    print(f"report: {Path(args.folder).resolve()}")
    for line in _repro_lines(summary.get("repros") or [], Path(args.folder)):  # as the run printed them
        print(line)
    return 0


def _repro_lines(repros: list[dict[str, Any]], folder: Path | None = None) -> list[str]:
    """The terminal's line for each repro of a run (`ReproOutcome.to_dict`s, as summary.json keeps them); with
    `folder` (the report read back, maybe moved or named from elsewhere), each file as it is found there."""
    lines = []
    for repro in repros:
        what = repro["invariant"] + (f" ({repro['error_type']})" if repro.get("error_type") else "")
        if repro.get("path"):
            path = Path(repro["path"])
            if folder is not None and (folder / path.name).is_file():  # the summary keeps the path as --out was typed
                path = folder / path.name
            lines.append(f"repro: {path.resolve()}  {what}, seen failing the same way "
                         f"(rerun: rollout-bench run --repro {path})")
        else:
            lines.append(f"repro: none for {what}: {repro.get('note', '')}")
    return lines


def _cmd_tokenizer(args: argparse.Namespace) -> int:
    from bench.tokenizer import tokenizer_path

    print(tokenizer_path())
    return 0


def _cmd_traces(args: argparse.Namespace) -> int:
    for name, (_, kind, n, seed) in sorted(SHIPPED_TRACES.items()):
        print(f"{name:<14} {kind:<8} n={n:<5} seed={seed:<3} {shipped_trace(name)}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    import json

    from bench.arguments import check_output_file
    from bench.importers import DumpError, ImportOptions, import_dump

    check_output_file("--out", args.out)
    try:
        sampling = json.loads(args.sampling_params) if args.sampling_params else None
    except json.JSONDecodeError as error:
        raise ValueError(f"--sampling-params: not JSON: {error}") from error
    if sampling is not None and not isinstance(sampling, dict):
        raise ValueError("--sampling-params: expected a JSON object")
    options = ImportOptions(model=args.model, tokenizer_name=args.tokenizer_name, vocab_size=args.vocab_size,
                            eos_token_id=args.eos_token_id, context_length=args.context_length,
                            sampling_params=sampling)
    try:
        summary = import_dump(args.kind, args.path, args.out, options)
    except DumpError as error:
        print(f"rollout-bench import: error: {error}", file=sys.stderr)
        return 1
    for note in summary.details.get("tokenizer", []):
        print(f"import: {note}", file=sys.stderr)
    print(f"wrote {summary.trajectories} trajectories ({summary.groups} groups, {summary.turns} turns, tokenizer "
          f"{summary.tokenizer}) to {summary.path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from bench.synth import DEFAULT_CREATED, KINDS

    parser = argparse.ArgumentParser(prog="rollout-bench", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rollout-bench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    synth = sub.add_parser("synth", help="write a seeded synthetic trace")
    synth.add_argument("--kind", required=True, choices=sorted(KINDS),
                       help="; ".join(f"{name}: {kind.description}" for name, kind in sorted(KINDS.items())))
    synth.add_argument("--n", type=int, required=True, help="number of trajectories")
    synth.add_argument("--seed", type=int, required=True)
    synth.add_argument("--out", required=True, help="output file (.jsonl or .jsonl.gz)")
    synth.add_argument("--group-size", type=int, default=None, help="trajectories per prompt (default per kind)")
    synth.add_argument("--context-length", type=int, default=None, help="context budget in tokens (default per kind)")
    synth.add_argument("--created", default=DEFAULT_CREATED, help="creation time written to the header")
    synth.add_argument("--turns", type=int, default=None,
                       help="agentic: every trajectory plans this many turns (default long-tailed, 5-50)")
    synth.add_argument("--tool-output-tokens", type=int, default=None,
                       help="agentic: median tool output in tokens (default 60; long-tailed around it)")
    synth.set_defaults(run=_cmd_synth)

    validate = sub.add_parser("validate", help="check whole traces; prints FILE:LINE: field: message")
    validate.add_argument("files", nargs="+", metavar="FILE", help="trace file or shipped trace name")
    validate.set_defaults(run=_cmd_validate)

    inspect = sub.add_parser("inspect", help="tables and summary of a trace")
    inspect.add_argument("trace", nargs="?", default=DEFAULT_TRACE,
                         help=f"trace file or shipped trace name (default {DEFAULT_TRACE})")
    inspect.add_argument("--out", help="report folder (default reports/inspect-<trace>)")
    inspect.set_defaults(run=_cmd_inspect)

    from bench.server import DEFAULT_PROFILE, PROFILES
    from bench.server.profiles import DEFAULT_ENGINE, ENGINES

    serve = sub.add_parser("serve", help="run the mock SGLang / vLLM / router server standalone")
    serve.add_argument("--trace", default=DEFAULT_TRACE,
                       help=f"trace file or shipped trace name (default {DEFAULT_TRACE})")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=port, default=30000, help="port (0: pick a free one; default 30000)")
    serve.add_argument("--sglang-version", default=DEFAULT_PROFILE, choices=list(PROFILES),
                       help=f"response shapes of this SGLang release (default {DEFAULT_PROFILE})")
    serve.add_argument("--sglang-build", default=DEFAULT_ENGINE, choices=list(ENGINES),
                       help="admin behaviour of this SGLang build where a framework pins a fork (sglang-miles: "
                            f"/flush_cache goes through while paused with nothing running; default {DEFAULT_ENGINE})")
    serve.add_argument("--time-scale", type=non_negative, default=0.0,
                       help="replay recorded latencies scaled by this (0: as fast as possible, 1: real time)")
    serve.add_argument("--router-version", default="0.3.2", choices=["0.3.2", "0.2"],
                       help="router surface answers of this sglang-router release")
    serve.add_argument("--openai-flavor", default="vllm", choices=["vllm", "sglang"],
                       help="shape of the OpenAI-compatible routes")
    serve.add_argument("--incremental-streaming-output", action="store_true",
                       help="stream deltas instead of cumulative chunks, as SGLang's flag of that name")
    serve.add_argument("--plan", help="fault plan: a TOML file or a shipped plan name (see `rollout-bench faults`)")
    serve.add_argument("--fault", action="append", metavar="SPEC",
                       help="a fault rule, e.g. 'missing_logprobs:p=1/400' (repeatable; added to --plan)")
    serve.add_argument("--seed", type=int, help="fault plan seed (overrides the plan's)")
    serve.add_argument("--tokenizer", metavar="DIR", help="the trace's tokenizer when it is not the bench's (a "
                       "recording of a real model): a local Hugging Face tokenizer folder")
    serve.add_argument("--log-dir", help="write the request log and fault log (CSV) here on shutdown")
    _control_token_argument(serve)
    _limit_arguments(serve)
    serve.set_defaults(run=_cmd_serve)

    proxy = sub.add_parser("proxy", help="the fault engine in front of a live SGLang / vLLM server or router")
    proxy.add_argument("--upstream", required=True, help="the live engine's URL (http://host:port)")
    proxy.add_argument("--plan", help="fault plan: a TOML file or a shipped plan name; a fault that cannot act on "
                       "a live engine's replies is refused by name")
    proxy.add_argument("--fault", action="append", metavar="SPEC", help="a fault rule (repeatable)")
    proxy.add_argument("--seed", type=int, help="fault plan seed (overrides the plan's)")
    proxy.add_argument("--trace", help="the dataset the client sends (a trace): requests are named by its "
                       "trajectory and group ids (default: ids made from the traffic)")
    proxy.add_argument("--tokenizer", metavar="DIR", help="the model's local tokenizer folder (transformers); "
                       "needed unless the upstream tokenizes as the bench's own tokenizer")
    proxy.add_argument("--context-length", type=int_at_least(1), help="the model's context length, when the upstream names none")
    proxy.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    proxy.add_argument("--port", type=port, default=30000, help="port (0: pick a free one; default 30000)")
    proxy.add_argument("--sglang-version", default=DEFAULT_PROFILE, choices=list(PROFILES),
                       help=f"SGLang release whose answer shapes the proxy writes (default {DEFAULT_PROFILE})")
    proxy.add_argument("--router-version", default="0.3.2", choices=["0.3.2", "0.2"],
                       help="sglang-router version whose 503 answers are written (default 0.3.2)")
    proxy.add_argument("--openai-flavor", choices=["vllm", "sglang"],
                       help="shape of the OpenAI-compatible answers (default: the upstream's, from /v1/models)")
    proxy.add_argument("--log-dir", help="write the request log and fault log (CSV) here on shutdown")
    _control_token_argument(proxy)
    _limit_arguments(proxy)
    proxy.set_defaults(run=_cmd_proxy)

    record = sub.add_parser("record", help="a reverse proxy in front of SGLang / vLLM / a router that forwards "
                            "everything unchanged and records the generations as a trace")
    record.add_argument("--upstream", required=True, metavar="URL", help="the live server (or router) to record")
    record.add_argument("--out", required=True, help="the trace to write (.jsonl, or .jsonl.gz: compressed at the "
                        "clean end); valid at every moment, even if the recorder is killed")
    record.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    record.add_argument("--port", type=port, default=30001, help="port to listen on (0: pick a free one; default 30001)")
    record.add_argument("--redact-text", action="store_true", help="keep token ids, drop every text")
    record.add_argument("--tokenizer", metavar="DIR", help="the model's tokenizer folder (local, Hugging Face "
                        "format): names the ids in the header and reads tool outputs from appended ids")
    record.add_argument("--context-length", type=int, help="the context budget, when the upstream does not say")
    record.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    record.set_defaults(run=_cmd_record)

    from bench.targets import DEFAULT_TARGET

    run = sub.add_parser("run", help="run a target against the server under a fault plan; check; report")
    run.add_argument("--trace", default=DEFAULT_TRACE, help=f"trace file or shipped name (default {DEFAULT_TRACE})")
    run.add_argument("--plan", help="fault plan file or shipped name (default seed-000 unless --fault is given; "
                                    "'none': no faults)")
    run.add_argument("--fault", action="append", metavar="SPEC", help="a fault rule (repeatable)")
    run.add_argument("--seed", type=int, help="fault plan seed (overrides the plan's)")
    run.add_argument("--target", help=f"NAME[:variant] or module:attr (default {DEFAULT_TARGET}; with --repro: "
                                      "the repro's, or this one, e.g. your fixed variant)")
    run.add_argument("--n", type=int_at_least(1), help="run only the first N trajectories")
    run.add_argument("--steps", type=int_at_least(1), metavar="K",
                     help="training steps: the rollout called K times in one worker, each step on the next N "
                          "trajectories, the weight version advanced between steps (default 1)")
    run.add_argument("--on-step-failure", choices=("stop", "continue"),
                     help="after a step that raised: stop (default), or continue with the next step in the same "
                          "process")
    run.add_argument("--compare-fresh", action="store_true",
                     help="with --steps: rerun the last step that ran clean in a fresh worker and compare outcomes, "
                          "token ids and turns (one worker more)")
    run.add_argument("--python", metavar="PATH", help="run the target in a worker under this interpreter (its own "
                     "virtual environment); default: the target's environment from `make targets`, else this one")
    run.add_argument("--in-process", action="store_true",
                     help="run the target as a task in the bench's own process (debugging; no isolation)")
    run.add_argument("--custom-generate-function-path", metavar="MODULE.FUNC",
                     help="slime/miles: a user's generate function, as their --custom-generate-function-path")
    run.add_argument("--custom-rm-path", metavar="MODULE.FUNC",
                     help="slime/miles: a user's reward function, as their --custom-rm-path")
    run.add_argument("--source", metavar="DIR", help="a framework run from source (slime, open-instruct, prime-rl): its "
                     "checkout; the report names it and its commit")
    run.add_argument("--slime-path", metavar="DIR", help="--source's older name")
    run.add_argument("--mode", choices=("train", "eval"), help="slime/miles: the train or the eval rollout path")
    run.add_argument("--target-option", action="append", metavar="KEY=VALUE", default=[],
                     help="any other option for the target adapter (repeatable; JSON values allowed)")
    run.add_argument("--concurrency", type=int_at_least(1), help="requests in flight at most (default 64; a repro's own)")
    run.add_argument("--time-scale", type=non_negative,
                     help="replay recorded latencies scaled by this (default 0.05: requests overlap as in "
                          "production, a 500-trajectory run takes seconds; with --repro: the repro's own)")
    run.add_argument("--watchdog", type=positive_seconds,
                     help="seconds without progress (a sample finished, or a recorded turn answered for the first "
                          "time) before the run ends as a hang, or a livelock if requests kept coming (30; a "
                          "repro's own)")
    run.add_argument("--deadline", type=positive_seconds,
                     help="seconds after which any run ends, start-up included: stacks taken, worker killed, a "
                          "liveness violation (3600; a repro's own)")
    run.add_argument("--invariants", help="comma-separated invariants to check (default all)")
    run.add_argument("--known", metavar="NAME|FILE",
                     help="known findings (a shipped name, e.g. miles, or a TOML file): violations they declare are "
                          "reported with their reason but do not fail the run")
    run.add_argument("--max-weight-lag", type=int_at_least(0), help="staleness bound in versions (default 1)")
    run.add_argument("--max-requests", type=int_at_least(1), help="requests per trajectory before a storm (8)")
    run.add_argument("--budget", type=positive_seconds, help="liveness budget for the whole run, seconds")
    run.add_argument("--max-drift-share", type=share,
                     help="replay fidelity: share of requests off the recording above which the run is unfaithful "
                          "(default 0.05)")
    run.add_argument("--out", help="report folder (default reports/run-<time>)")
    run.add_argument("--force", action="store_true",
                     help="write the report into an existing non-empty --out folder (files of the same name are "
                          "replaced); without it such a folder is refused before the run starts")
    run.add_argument("--junit", help="also write the JUnit XML here")
    run.add_argument("--repro", help="rerun a repro file (repro*.toml, or run.toml: the whole run) with every input "
                     "it recorded; options given here override it")
    run.add_argument("--trust-plugin", action="store_true",
                     help="with --repro: run the target module or interpreter the file names even when it is outside "
                     "this project and the bench (a repro from another machine's CI artifact)")
    run.add_argument("--repro-reruns", type=int_at_least(0), default=12, metavar="N",
                     help="after a failing run, rerun each failure at most N times to verify and shrink its repro "
                          "(default 12; 0: write no repro, only run.toml)")
    run.add_argument("--upstream", metavar="URL", help="a live SGLang / vLLM server: the target's requests go "
                     "through the fault proxy to it instead of to the mock; the trace gives only the prompts (replay "
                     "fidelity then does not apply; --time-scale neither: the engine paces its answers)")
    run.add_argument("--tokenizer", metavar="DIR", help="the trace's tokenizer when it is not the bench's (a recording "
                     "of a real model; a local Hugging Face folder): the mock adapts answers with it and the target "
                     "loads it; with --upstream, the engine's model's tokenizer")
    run.add_argument("--cold", action="store_true",
                     help="start a fresh worker even when a warm one (`rollout-bench worker`) runs for the target")
    run.set_defaults(run=_cmd_run)

    worker = sub.add_parser("worker", help="keep a target imported in a warm process; its runs fork from it "
                            "(a miles repro in seconds, not a 7-10 s import each time)")
    worker.add_argument("--target", required=True, help="target NAME[:variant] (the variant does not matter)")
    worker.add_argument("--python", metavar="PATH", help="the target's interpreter (default as for run)")
    worker.add_argument("--idle-timeout", type=positive_seconds, default=1800.0,
                        help="exit after this many seconds without a run (default 1800)")
    worker.add_argument("--detach", action="store_true", help="return once it is ready, leaving it running")
    worker.add_argument("--stop", action="store_true", help="stop the warm worker for this target")
    worker.add_argument("--log", help="the warm worker's log file (default: beside its socket in its runtime "
                        "folder, removed when it exits)")
    worker.add_argument("--source", metavar="DIR",
                        help="a framework run from source (slime, open-instruct, prime-rl): its checkout")
    worker.add_argument("--slime-path", metavar="DIR", help="--source's older name")
    worker.add_argument("--target-option", action="append", metavar="KEY=VALUE", default=[],
                        help="target adapter options for its warm-up (as for run)")
    worker.set_defaults(run=_cmd_worker, custom_generate_function_path=None, custom_rm_path=None, mode=None)

    sweep = sub.add_parser("sweep", help="run a grid of plans x targets x fault rates x seeds, a process per "
                           "run, into one table (DIR/sweep.csv)")
    sweep.add_argument("--plan", help="plan files or shipped names, comma-separated")
    sweep.add_argument("--target", help="targets (NAME[:variant] or module:attr), comma-separated")
    sweep.add_argument("--rates",
                       help="fault rates in [0, 1], comma-separated (0.01 or 1/400): each plan's most likely "
                            "probability rule fires with this p, its other `p` rules keep their ratio to it; "
                            "rules without `p` are left alone; 0 removes the `p` rules")
    sweep.add_argument("--seeds", help="plan seeds, comma-separated (each replaces the plan's own)")
    sweep.add_argument("--out", help="a new or empty folder: runs/<id>/ per run, sweep.csv, sweep.json")
    sweep.add_argument("--resume", metavar="DIR", help="finish the sweep in DIR (its driver died or was stopped): "
                       "run only its missing runs, with its grid and options (any given again must match)")
    sweep.add_argument("--shard", metavar="K/N", help="run part K of N of the grid (points K-1, K-1+N, ...), e.g. "
                       "one CI job each")
    sweep.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                       help="run each point as a task on a Ray cluster (default address: RAY_ADDRESS or the "
                            "local cluster; needs rollout-bench[ray] on every node)")
    sweep.add_argument("--trace", help=f"trace file or shipped name (default {DEFAULT_TRACE})")
    sweep.add_argument("--n", type=int_at_least(1), help="run only the first N trajectories of the trace")
    sweep.add_argument("--jobs", type=int, help="runs at once (default: the cores this process may use; with "
                       "--ray, the cluster's CPUs)")
    sweep.add_argument("--timeout", type=float,
                       help="seconds per run before it is killed with its children and recorded as timeout (600)")
    sweep.add_argument("--time-scale", type=non_negative, help="as for run (default 0.05; 0: fastest)")
    sweep.add_argument("--concurrency", type=int_at_least(1), help="as for run (default 64)")
    sweep.add_argument("--watchdog", type=positive_seconds, help="as for run (default 30)")
    sweep.add_argument("--known", metavar="NAME|FILE", help="known findings for every run (as for run)")
    sweep.add_argument("--steps", type=int_at_least(1), metavar="K",
                       help="as for run: K training steps per run in one worker (default 1)")
    sweep.add_argument("--on-step-failure", choices=("stop", "continue"),
                       help="as for run, with --steps (default stop)")
    sweep.add_argument("--compare-fresh", action="store_true",
                       help="as for run, with --steps: every run reruns its last clean step in a fresh worker")
    sweep.add_argument("--invariants", help="comma-separated invariants to check (default all but vacuity: a rule "
                                            "that never fired at a low rate is data, the fault_events column)")
    sweep.add_argument("--python", metavar="PATH", help="as for run: the target worker's interpreter")
    sweep.add_argument("--in-process", action="store_true", help="as for run: the target in the run's process")
    sweep.set_defaults(run=_cmd_sweep)

    importer = sub.add_parser("import", help="turn a framework's dump into a trace (slime/miles debug rollout data, "
                              "SGLang's request dumps)")
    importer.add_argument("kind", choices=["slime-debug", "miles-debug", "sglang-dump"],
                          help="slime-debug (alias miles-debug): --save-debug-rollout-data files; sglang-dump: "
                               "a --dump-requests-folder")
    importer.add_argument("path", help="the dump: a file, or a folder of them")
    importer.add_argument("--out", required=True, help="trace to write (.jsonl or .jsonl.gz)")
    importer.add_argument("--model", help="model name for the header (default: the dump's, else 'unknown')")
    importer.add_argument("--tokenizer-name", help="the ids' tokenizer (default: rollout-bench/byte-bpe-v1 when the "
                          "dump fits it, else 'unknown')")
    importer.add_argument("--vocab-size", type=int, help="default: the tokenizer's, else the largest id seen + 1")
    importer.add_argument("--eos-token-id", type=int,
                          help="default: the tokenizer's, else the most common last id of stopped answers")
    importer.add_argument("--context-length", type=int, help="default: the dump's, else the longest trajectory")
    importer.add_argument("--sampling-params", metavar="JSON",
                          help="sampling params for requests whose dump does not hold them (slime/miles; default {})")
    importer.set_defaults(run=_cmd_import)

    report = sub.add_parser("report", help="re-render a run's report folder, print its summary; or list a sweep's runs")
    report.add_argument("folder")
    report.set_defaults(run=_cmd_report)

    sub.add_parser("faults", help="list the fault types, their parameters and the shipped plans").set_defaults(
        run=_cmd_faults)
    sub.add_parser("tokenizer", help="print the shipped tokenizer folder").set_defaults(run=_cmd_tokenizer)
    sub.add_parser("traces", help="list the shipped traces").set_defaults(run=_cmd_traces)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from bench.isolation import TargetStartError
    from bench.isolation.warm_client import WarmStartError
    from bench.synth import SynthError
    from bench.targets import TargetError
    from bench.trace import TraceFormatError
    from faults import FaultError, PlanError

    args = build_parser().parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    import signal

    # past a file size limit (`ulimit -f`) a write then fails with EFBIG, which names the file, instead of the kernel
    # killing the process silently mid-report
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        return command(args)
    except BrokenPipeError:  # output piped into `head` and friends
        sys.stdout = open(os.devnull, "w")
        return 0
    except (ArgumentError, TraceFormatError, SynthError, PlanError, FaultError, TargetError, TargetStartError, WarmStartError,
            FileNotFoundError, KeyError, ValueError, OSError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        print(f"rollout-bench: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rollout-bench: interrupted", file=sys.stderr)
        return 130
    except _Terminated as stop:
        print(f"rollout-bench: stopped by {stop.name}", file=sys.stderr)
        return 128 + stop.signum
