"""Teaching notebooks (jupytext percent-format sources); ``python -m notebooks.build`` executes them."""
