"""Streamlit-side helpers shared by the pages (the pages themselves live in ``pages/``)."""
