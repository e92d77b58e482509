"""People in the loop (issue 34): votes and edits on answers become preference data, and people's ratings check the
LLM judge. Pure functions, no Streamlit:

* ``votes``: what a vote is (kinds, labels, limits), built from what the Playground shows and checked;
* ``service``: the one API the pages and the CLI call (who may vote, withdraw, export, rate), over the store;
* ``agreement``: filters, counts per run and per person, agreement between people on the same answers, conflicts;
* ``export``: DPO pairs (prompt/chosen/rejected) and KTO rows (prompt/completion/label) written as versioned JSONL
  into the data root, with their lineage (which votes);
* ``calibration``: the judge against people (Spearman, Kendall, Cohen's kappa, bootstrap intervals, the flag).
"""
