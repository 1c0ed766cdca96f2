"""bayes-zoo's command line ``zoo`` (the top floor: it imports ``zoo``, ``inference`` and ``diagnostics``, and
nothing imports it). ``python -m zoo_cli`` runs it too."""

from zoo_cli.app import app

__all__ = ["app"]
