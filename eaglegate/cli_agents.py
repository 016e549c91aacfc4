"""`eaglegate mcp` and `eaglegate tool`: eaglegate for LLM agents.

`mcp` serves the agent tools over the Model Context Protocol (stdio); `tool NAME ARGS`
calls one of the same tools once and prints its JSON answer, for agents that shell out
instead. Both run `eaglegate.agents.tools`, so the answers share one schema.

No `from __future__ import annotations` here: the commands are defined inside
`register()`, so typer must see evaluated annotations.
"""

from typing import Annotated

import typer

from eaglegate.app.requests import LOG_LEVELS, check_choice
from eaglegate.cli_common import print_json
from eaglegate.errors import UserError


def register(app: typer.Typer) -> None:
    """Add the `mcp` and `tool` commands to the root app."""

    @app.command("mcp")
    def mcp_command(
        log_level: Annotated[
            str, typer.Option("--log-level", help="Server log level on stderr: DEBUG, INFO, WARNING or ERROR.")
        ] = "WARNING",
    ) -> None:
        """Serve eaglegate's agent tools over MCP on stdio (stdout carries only the protocol).

        Register it with a client, e.g.: claude mcp add eaglegate -- eaglegate mcp

        Example: eaglegate mcp --log-level INFO
        """
        level = check_choice("--log-level", log_level.upper(), LOG_LEVELS)
        try:
            from eaglegate.agents.server import serve
        except ImportError as exc:
            raise UserError(f"the MCP server needs the mcp extra: pip install 'eaglegate[mcp]' ({exc})") from None
        serve(level)  # type: ignore[arg-type]

    @app.command("tool")
    def tool_command(
        name: Annotated[str, typer.Argument(help="The tool: locate, map_paths, find_couplings, explain_symbol, "
                                                 "plan_gate, generate_patch, apply_patch, revert_patch, report, "
                                                 "calibrate_threshold.")],
        arguments: Annotated[str, typer.Argument(help="Its arguments as a JSON object, as over MCP.")] = "{}",
    ) -> None:
        """Call one agent tool and print its JSON answer (the same schema as over MCP).

        Example: eaglegate tool plan_gate '{"version": "0.5.9"}'
        """
        from eaglegate.agents.tools import call_tool, load_arguments

        # A bad argument exits 2 (`UsageError`), as over MCP it is an error answer in the same
        # words; a refusal of the work itself (a tree it must not write) exits 1.
        print_json(call_tool(name, load_arguments(arguments)))
