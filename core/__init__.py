"""The answer engine: retrieve, gate, rerank, prompt the model, check the citations.

Imports ``index``, never ``bot``; no Slack. Its modules are public as they are;
``core.answer.build_engine`` is where the layers above start.
"""
