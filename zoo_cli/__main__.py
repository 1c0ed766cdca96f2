"""``python -m zoo_cli``: the ``zoo`` command line."""

from zoo_cli.app import app

app()
