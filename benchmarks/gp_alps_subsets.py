"""``python -m benchmarks.gp_alps_subsets [diabetes|boston]``: the GP-ALPS §4.3 subset ranking, which lives in
the library (``inference.gp_alps.subsets``, shared with the gp_alps notebook and its test)."""

from __future__ import annotations

import sys

from inference.gp_alps.subsets import main

if __name__ == "__main__":
    main(sys.argv[1:])
