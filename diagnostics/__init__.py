"""bayes-zoo diagnostics: compare any posterior with an MCMC reference, and check calibration and
prior sensitivity.

>>> import diagnostics
>>> ref = diagnostics.references.get_or_generate("hlcr")
>>> card = diagnostics.scorecard(ref, {"gibbs": tree_gibbs, "svi": tree_svi})     # per quantity
>>> diagnostics.method_scores(ref, {"gibbs": tree_gibbs, "svi": tree_svi})        # per method + verdict
>>> view = diagnostics.compared_view(tree_gibbs)      # summaries, draws, ESS, R-hat, MCSE: computed once
>>> diagnostics.psis_khat(tree_svi)                                               # Yao et al. 2018
>>> diagnostics.sbc("hlcr", "gibbs", n_sims=200, seed=0)                          # resumable
>>> diagnostics.vsbc("hlcr", "svi", n_sims=200, seed=0)
>>> diagnostics.sensitivity(ref)                                                  # power-scaling + k-hat
>>> diagnostics.sensitivity_report("hlcr", frame, "gibbs", prior_sites=["w"])     # your data -> HTML page
>>> diagnostics.report("hlcr", {"reference": ref, "gibbs": tree_gibbs}, "out/hlcr")
>>> diagnostics.report_index({"hlcr": "out/hlcr/report.html"}, "out")
>>> from diagnostics.comparison import compare_model   # the pipeline of `zoo compare`
>>> compare_model("hlcr", ["nuts", "gibbs"], "out")     # fit (or reuse), report, verdict lines
>>> from diagnostics.demo import run_demo               # `zoo demo`: every model, then the index page
>>> diagnostics.posteriordb.export_posteriordb("pdb")                 # every stored reference, posteriordb's layout
>>> ref = diagnostics.reference_from_posteriordb("pdb", "hlcr_b2-hlcr")  # a posteriordb reference as ours
>>> diagnostics.cost_accuracy("ppca", None, ["vbem", "nuts"])   # every method on a ladder of budgets
>>> diagnostics.compare("hlcr", frame, ["gibbs", "vbem"], columns={"y": "sales", "agent": "store"})  # your data

Each function lives in a module named for what it does: ``compare`` and ``sensitivity_report`` in
``diagnostics.comparison`` (the pipeline of ``zoo compare``), ``report``/``report_index`` in
``diagnostics.report_pages``, ``sbc``/``vsbc`` in ``diagnostics.calibration``, ``scorecard``/``method_scores`` in
``diagnostics.scoring``, ``sensitivity`` in ``diagnostics.power_scaling``, ``cost_accuracy`` in
``diagnostics.ladders``. Below the pipeline, ``diagnostics.planning`` checks a comparison before anything runs
and ``diagnostics.own_references`` finds or makes its reference on your data; above it, ``diagnostics.demo`` runs
``zoo demo``, in worker processes (``diagnostics.workers``) or in this one.
"""

from zoo import _runtime  # noqa: F401  (JAX set-up and `import numpyro` before arviz)

# isort: split
from diagnostics import plots, posteriordb, references
from diagnostics.calibration import SBCResult, sbc, vsbc
from diagnostics.comparison import compare, sensitivity_report
from diagnostics.ladders import cost_accuracy, time_to_rule
from diagnostics.metrics import psis_khat
from diagnostics.posteriordb import reference_from_posteriordb
from diagnostics.power_scaling import sensitivity
from diagnostics.report_pages import report, report_index
from diagnostics.scoring import VERDICTS, method_scores, reference_health, scorecard
from diagnostics.view import ComparedView, compared_posterior, compared_view

__all__ = ["VERDICTS", "ComparedView", "SBCResult", "compare", "compared_posterior", "compared_view",
           "cost_accuracy", "method_scores",
           "plots", "posteriordb",
           "psis_khat", "reference_from_posteriordb", "reference_health", "references", "report", "report_index", "sbc",
           "scorecard",
           "sensitivity", "sensitivity_report", "time_to_rule", "vsbc"]
