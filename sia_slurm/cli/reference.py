"""The command-line reference, rendered from the click commands themselves.

docs/reference/cli.md is made from this at documentation build time
(``scripts/docs_hooks.py``), so the page says what ``--help`` says and cannot drift from it:
every command, its usage line, its help, and each option with its type, default and help.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click


def _heading(path: list[str]) -> str:
    level = "#" * min(len(path) + 1, 4)
    return f"{level} `{' '.join(path)}`"


def _options(command: click.Command, context: click.Context) -> Iterator[str]:
    rows = [
        record
        for param in command.get_params(context)
        if (record := param.get_help_record(context)) is not None
    ]
    if not rows:
        return
    yield "| option | meaning |"
    yield "|---|---|"
    for names, text in rows:
        cell = " ".join(text.split()).replace("|", "\\|")
        yield f"| `{names.replace('|', chr(92) + '|')}` | {cell} |"


def _help(text: str) -> Iterator[str]:
    """A command's help as Markdown: a paragraph click keeps as written (``\\b``) in a text
    block, the others as prose."""
    for paragraph in inspect.cleandoc(click.unstyle(text)).split("\n\n"):
        if paragraph.startswith("\b\n"):
            yield from ("```text", paragraph[2:], "```", "")
        elif paragraph.strip():
            yield " ".join(paragraph.split())
            yield ""


def command_markdown(
    command: click.Command, path: list[str], parent: click.Context | None = None
) -> Iterator[str]:
    """Markdown for ``command`` (named ``path``) and, for a group, each of its subcommands."""
    # The command's own context settings (``-h`` beside ``--help``), as ``make_context`` would
    # apply them: click caches a command's help option from the first context that asks, so a
    # bare context here gave every later ``--help`` in the process a help option without -h.
    context = click.Context(command, info_name=path[-1], parent=parent, **command.context_settings)
    yield _heading(path)
    yield ""
    yield "```text"
    yield " ".join(command.collect_usage_pieces(context)).join((f"{' '.join(path)} ", "")).rstrip()
    yield "```"
    yield ""
    yield from _help(command.help or "")
    options = list(_options(command, context))
    if options:
        yield from options
        yield ""
    if isinstance(command, click.Group):
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None and not sub.hidden:
                yield from command_markdown(sub, [*path, name], context)


def reference_markdown(commands: list[tuple[str, click.Command]]) -> str:
    """Markdown for each ``(program name, command)`` in order."""
    lines: list[str] = []
    for name, command in commands:
        lines += command_markdown(command, [name])
    return "\n".join(lines) + "\n"
