"""bayes-zoo's command line ``zoo`` (the top floor: it imports ``zoo``, ``inference`` and ``diagnostics``, and
nothing imports it). ``zoo_cli.app`` is its typer application, the ``zoo`` entry point; the commands are in
``zoo_cli.commands``. ``python -m zoo_cli`` runs it too."""

from zoo_cli.commands import app

__all__ = ["app"]
