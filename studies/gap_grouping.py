"""Knowledge gaps: how well the wordings of one question group together at each similarity.

Grouping (``core.gaps.similarity_groups``), per bundled evaluation set: every
question's documentation wording, its support-ticket wording and the
out-of-domain questions clustered together, embedded with the bundled model.
Reported per threshold: how many questions have both wordings in one group
(wanted) and how many questions end up inside another question's group
(hidden from App Home's list: not wanted). What the list costs to build is
measured by ``python -m bench.gaps``.

Run: python -m studies.gap_grouping [--json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from core.gaps import SIMILARITY, similarity_groups
from evaluation.inputs import bundled_set, load_ood, load_questions
from index.embed import Embedder
from index.embed.pytorch import LocalEmbedder

SETS = ("pip-black", "prometheus")
THRESHOLDS = (0.6, 0.65, 0.7, 0.75, 0.8)


def grouping(embedder: Embedder, name: str) -> list[dict[str, Any]]:
    """Per threshold: wordings of one question grouped, and questions hidden in another's group."""
    paths = bundled_set(name)
    questions = load_questions(paths.questions)
    ood = [o.question for o in load_ood(paths.ood)]
    owners = [q.id for q in questions] * 2 + [f"ood-{i}" for i in range(len(ood))]
    texts = [q.doc_phrasing for q in questions] + [q.ticket_phrasing for q in questions] + ood
    vectors = embedder.encode(texts)
    n = len(questions)
    rows = []
    for threshold in THRESHOLDS:
        labels = similarity_groups(vectors, threshold)
        members: dict[int, set[str]] = {}
        for label, owner in zip(labels, owners, strict=True):
            members.setdefault(label, set()).add(owner)
        rows.append(
            {
                "set": name,
                "threshold": threshold,
                "groups": len(members),
                "both_wordings_together": sum(labels[i] == labels[i + n] for i in range(n)),
                "questions": n,
                "hidden_in_another_group": sum(len(m) - 1 for m in members.values()),
                "distinct_questions": n + len(ood),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    embedder = LocalEmbedder("bundled:all-MiniLM-L6-v2")
    rows = [r for name in SETS for r in grouping(embedder, name)]
    if args.json:
        print(json.dumps({"grouping": rows}, indent=2))
        return
    print(f"grouping (SIMILARITY in force: {SIMILARITY})")
    print("set         threshold  groups  both wordings together  hidden in another's group")
    for r in rows:
        print(
            f"{r['set']:<11} {r['threshold']:>9}  {r['groups']:>6}  "
            f"{r['both_wordings_together']:>5} / {r['questions']:<16}  "
            f"{r['hidden_in_another_group']:>3} / {r['distinct_questions']}"
        )


if __name__ == "__main__":
    main()
