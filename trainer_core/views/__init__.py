"""What pages draw, as pure functions without Streamlit: every chart (charts) and the rules pages share about runs
(run_rules).
"""
