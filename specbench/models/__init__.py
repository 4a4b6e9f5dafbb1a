"""Models: the catalog of named models, fetching/assembling/converting them, loading and
tokenizer checks. Submodules are imported directly (`specbench.models.loading`) so importing
the package stays cheap (no torch)."""
