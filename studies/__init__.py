"""Retrieval-quality studies: variants of the engine measured on the bundled evaluation sets.

Each module measures what ``kb eval`` does not (other BM25 analyses and fusions,
sentence vectors, other gate signals, how knowledge gaps group questions),
indexing a set with the product's own ingestion; their numbers, and what was
adopted or rejected because of them, are in docs/evaluation.md. Speed is
measured in ``bench/`` (docs/benchmarks.md).

Not part of the product: nothing imports this package and it is not installed.
Each study is run by hand, ``python -m studies.NAME`` from the repository root;
like ``bot/cli/``, they read ``bot.settings.Settings``, which ``evaluation/``
never does.
"""
