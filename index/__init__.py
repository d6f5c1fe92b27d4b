"""Storage and ingestion: documents -> chunks -> vectors, kept in a database and searched.

No language model, no Slack. The top-level modules are public as they are:
``config`` (``IndexConfig``), ``errors`` (every error of the product),
``models`` and ``records`` (plain data and typed rows), ``names``,
``normal_form`` (the form questions are searched in), ``near_copies`` (documents
whose text is nearly another's), ``kept_model`` (the
earlier default model a knowledge base built on it keeps) and ``knowledge_base``
(``KnowledgeBase``, what the layers above use). Each sub-package is a room
with a face (its ``__init__``, ``__all__``) that others import from:

* ``files``: the data dir's files (private modes, atomic replacement, free space);
* ``ingest``: bytes -> canonical text -> chunks (and their sentences);
* ``embed``: the ``Embedder`` contract and its ONNX, PyTorch and remote models;
* ``storage``: the database (SQLite or Postgres), its schema and the ``Store``;
* ``search``: the ``SearchIndex`` contract, fusion, the local engine and Qdrant;
* ``sync``: ``kb sync``'s sources and the fetch policy for URLs.
"""
