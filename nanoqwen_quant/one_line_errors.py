"""A click command whose failures print as ONE line on stderr: `PROG: error: ...` and exit 2 for usage errors
(unknown option, bad value), 130 after Ctrl-C, 3 for an unexpected exception (`PROG: internal error: ...`). No
usage dump, no traceback."""
from __future__ import annotations

import sys

import click

from .entry import EXIT_INTERRUPTED

EXIT_USAGE = 2
EXIT_INTERNAL = 3


class OneLineErrorCommand(click.Command):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            click.echo(f"{self.name}: error: {_flat(e.format_message())} (see '{self.name} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except click.ClickException as e:
            click.echo(f"{self.name}: error: {_flat(e.format_message())}", err=True)
            sys.exit(e.exit_code)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo(f"{self.name}: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as e:   # a bug of ours, or an input no check foresaw: still one line, and its own code
            click.echo(f"{self.name}: internal error: {type(e).__name__}: {_flat(e)}", err=True)
            sys.exit(EXIT_INTERNAL)
        sys.exit(rv if isinstance(rv, int) else 0)


def _flat(text: str) -> str:
    return " ".join(str(text).split())
