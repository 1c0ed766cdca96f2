"""``python -m zoo_cli``: the ``zoo`` command line."""

from zoo_cli.commands import app

app()
