"""`eaglegate plan`: the gate plan for the located SGLang and the user's launch flags."""

import json
from typing import Annotated

import typer

from eaglegate import app
from eaglegate.cli_common import (
    GitOpt,
    JsonOpt,
    OptionalThresholdOpt,
    PathOpt,
    PythonOpt,
    RevOpt,
    VersionOpt,
    err,
    locate_tree,
    out,
    print_json,
    progress_bar,
)
from eaglegate.errors import UserError


def register(root: typer.Typer) -> None:
    @root.command("plan")
    def plan_command(
        threshold: OptionalThresholdOpt = None,
        flags: Annotated[str, typer.Option("--flags", help='The server\'s launch flags, e.g. "--speculative-algorithm EAGLE3".')] = "",
        env: Annotated[list[str] | None, typer.Option("--env", help="An environment variable of the server, NAME=VALUE (repeatable).")] = None,
        config_out: Annotated[str | None, typer.Option("--config-out", help="Write the adaptive config here (native-adaptive plans, and a depth table's tiers).")] = None,
        depth_table: Annotated[str | None, typer.Option("--depth-table", help="A depth table for the overlap worker's depth gate (inline JSON or a file, as `calibrate --depth` writes): checked, and its launch flags planned.")] = None,
        path: PathOpt = None,
        python: PythonOpt = None,
        git: GitOpt = None,
        rev: RevOpt = None,
        version: VersionOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Which worker runs under your flags, and how to gate it in this version.

        --flags is read as the version's own server reads it (declared options, unambiguous
        prefixes such as --tp, their types) and post-processed as it is (NEXTN runs as EAGLE).
        A launch that builds no EAGLE worker (NGRAM) has no gate: the plan says why, and the
        exit status is 1.

        Example: eaglegate plan --version 0.5.9 --threshold 64 --flags "--speculative-algorithm EAGLE3"

        Example: eaglegate plan --version 0.5.16 --depth-table depth.json --config-out adaptive_depth.json
        """
        # Imported here, like every command's analysis: the CLI starts without loading it.
        from eaglegate.patches.plan import ADAPTIVE_FLAGS
        from eaglegate.reports.terminal import render_plan

        request = app.PlanRequest(threshold, app.Launch(flags, env or []), config_out, depth_table)
        config_out = request.config_out  # checked: None, a path whose folder exists, not the table
        app.check_output(config_out, {"tree given with --path": path, "interpreter given with --python": python,
                                      "repository given with --git": git})
        tree = locate_tree(path, python, git, rev, version)
        with progress_bar("parsing", enabled=not as_json) as progress:
            analysis = app.analyse(tree, progress)
        plan = app.plan_of(analysis, request)
        if plan.depth is not None:
            # A depth table's launch takes its own tiers' config or none: another route's
            # config beside the table's flag would configure tiers the table never chose.
            config = plan.adaptive_config
            if config_out and config is None:
                raise UserError(f"--config-out: the depth table's route on SGLang {tree.version} has no "
                                f"adaptive config ({plan.depth.get('collapsed', 'no tiers')}); nothing was written")
        else:
            # The route's own config, else the native alternative's (0.5.14 on, beside the patch).
            config = plan.adaptive_config or next(
                (a["adaptive_config"] for a in plan.alternatives if a.get("adaptive_config")), None)
        if config_out and config is None:
            # Only a native-adaptive plan has a config; writing nothing and saying nothing
            # would leave the user launching with a file that is not there.
            raise UserError(f"--config-out: the plan for SGLang {tree.version} under these flags is "
                            f"{plan.family}, which has no adaptive config (native adaptive speculation "
                            f"needs a version that declares {ADAPTIVE_FLAGS[0]}); nothing was written")
        if config_out and config is not None:
            app.write_file(config_out, (json.dumps(config, indent=2) + "\n").encode())
            err.print(f"wrote {config_out}")
        if as_json:
            print_json(plan.to_json())
        else:
            out.print(render_plan(plan))
        if plan.worker is None:
            # Nothing to gate (NGRAM, a multi-layer EAGLE worker…): the plan says why, and
            # the exit status says there is no gate to apply, for scripts that only read it.
            raise UserError(f"no gate for this launch: {plan.caveats[0]}")
