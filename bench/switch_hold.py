"""How long a move to another embedding model holds a server's searches, and what a
question costs while the new model's query map is fitted.

A set's corpus (default pip-black) is ingested on the earlier default model
(all-MiniLM-L6-v2) into a fresh data dir. The knowledge base is then opened as
``kb serve`` opens it on the default model (it keeps MiniLM, fits in the
background) and ``/kb-reindex`` moves it: every document is embedded on the
default model beside the live index, then, inside the switch (where the server
holds its searches), swapped in. Reported: the seconds spent inside the switch
(the searches held), the seconds until the new model's map is written, and the
p50 of a question (its embedding and its hybrid search) while that fit runs
and once it is done.

``--niceness 0`` runs the fit at the server's own priority, for the comparison.

Run: python -m bench.switch_hold [--set pip-black] [--questions 20] [--niceness 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.machine import describe as machine
from index.config import DEFAULT_EMBEDDING_MODEL, PREVIOUS_DEFAULT_MODEL, IndexConfig
from index.knowledge_base import KnowledgeBase
from index.search import query_map

SETS = Path(__file__).resolve().parents[1] / "evaluation" / "sets"


def _config(data_dir: Path, model: str) -> IndexConfig:
    cache = os.environ.get("KB_ENCODER_CACHE")
    extra = {"encoder_cache": Path(cache)} if cache else {}
    return IndexConfig(data_dir=data_dir, embedding_model=model, **extra)  # type: ignore[arg-type]


def _questions(name: str, n: int) -> list[str]:
    lines = (SETS / name / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    return [str(json.loads(line)["ticket_phrasing"]) for line in lines if line.strip()][:n]


def _ask_ms(kb: KnowledgeBase, question: str) -> float:
    t = time.perf_counter()
    vector = kb.question_vector(question)
    kb.search_index.search(vector, question, None, 20)
    return (time.perf_counter() - t) * 1000


def run(set_name: str, n_questions: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kb-bench-switch-") as tmp:
        data_dir = Path(tmp)
        seed = KnowledgeBase(_config(data_dir, PREVIOUS_DEFAULT_MODEL))
        seed.ingest_paths([SETS / set_name / "corpus"])
        seed.store.close()

        kb = KnowledgeBase(_config(data_dir, DEFAULT_EMBEDDING_MODEL), fit_in_background=True)
        assert kb.kept_model is not None, "the store should keep the earlier model"
        held: list[float] = []

        @contextmanager
        def switch() -> Iterator[None]:
            started = time.perf_counter()
            yield
            held.append(time.perf_counter() - started)

        started = time.perf_counter()
        kb.reindex(switch=switch)
        returned = time.perf_counter()
        asked = _questions(set_name, n_questions)
        during: list[float] = []
        fitting = kb.fits.latest() if kb.fits is not None else None
        while fitting is not None and not fitting.done():
            during.append(_ask_ms(kb, asked[len(during) % len(asked)]))
        fitted = fitting.result() if fitting is not None else None
        map_at = time.perf_counter()
        idle = [_ask_ms(kb, q) for q in asked * 2]
        kb.stop_fitting()
        adapter = kb.query_adapters.current()
        return {
            "set": set_name,
            "model": kb.embedder.name,
            "chunks": kb.store.searchable_chunk_count(kb.embedder.name, kb.embedder.dim),
            "searches held s": round(held[0], 2) if held else None,
            "reindex s": round(returned - started, 2),
            "map written s after the reindex returned": round(map_at - returned, 2),
            "map in use": adapter.describe() if adapter is not None else None,
            "fitted in the background": fitted is not None,
            "fit niceness": query_map.FIT_NICENESS,
            "questions during the fit": len(during),
            "p50 during the fit ms": round(statistics.median(during), 1) if during else None,
            "p50 after the fit ms": round(statistics.median(idle), 1),
            "load": os.getloadavg()[0],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="pip-black")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--niceness", type=int, default=query_map.FIT_NICENESS)
    args = parser.parse_args()
    query_map.FIT_NICENESS = args.niceness
    print(json.dumps({"machine": machine(), **run(args.set, args.questions)}, indent=2))


if __name__ == "__main__":
    main()
