"""`mmrl report`: docs/results.md and the README's table from a demo's or sweep's summaries (page.py),
and the plots and episode strips the demo writes (plots.py)."""
