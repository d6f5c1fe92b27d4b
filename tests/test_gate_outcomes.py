"""What ``kb eval`` and ``kb calibrate`` say the asker gets at the two thresholds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.settings import Settings
from core.retrieve import Candidate
from evaluation.calibrate import write_env
from evaluation.outcomes import Replay, propose_related, related_sweep
from index.search.query_map import MIN_ANCHORS
from tests.evalmini import EVALSET_OPTIONS

# evalmini's in-domain best distances spread from ~0.33 to ~0.76 and its
# out-of-domain ones start near 0.84: these put in-domain queries in all three outcomes.
THRESHOLD = 0.4
RELATED = 0.6


def _cands(*pairs: tuple[int, float]) -> list[Candidate]:
    return [Candidate(cid, d, 1.0 / (i + 1)) for i, (cid, d) in enumerate(pairs)]


def _replay() -> Replay:
    in_domain = [
        _cands((1, 0.30), (2, 0.31), (3, 0.50)),  # answered, needle 2 kept
        _cands((4, 0.45), (5, 0.48), (6, 0.70)),  # related, needle 5 shown: rescued
        _cands((7, 0.45), (8, 0.70)),  # related, needle 8 too far: not shown
        _cands((9, 0.80)),  # hard refused
    ]
    ood = [_cands((1, 0.38)), _cands((4, 0.49)), _cands((9, 0.8))]
    correct = [{2}, {5}, {8}, {9}]
    sizes = {cid: 100 * cid for cid in range(1, 10)}
    return Replay(in_domain, ood, correct, sizes, top_k=1, max_kept=2, margin=0.05)


def test_outcomes_replay_the_engines_decision() -> None:
    o = _replay().outcomes(0.4, 0.6)
    assert o.answered == [True, False, False, False]
    assert o.related == [False, True, True, False]
    assert o.hard_refused == [False, False, False, True]
    assert o.shown == [True, True, False, False]
    assert o.rescued == [False, True, False, False]
    assert o.bluffs == [True, False, False] and o.ood_related == [False, True, False]
    # Adaptive: chunk 2 is within 0.05 of the best, so it joins the top 1.
    assert o.kept_needle == [True, False, False, False]
    assert o.fixed_needle == [False, False, False, False]
    assert (o.kept_passages, o.fixed_passages) == ([2], [1])
    assert (o.kept_chars, o.fixed_chars) == ([300], [100])
    current = o.current()
    assert current["shown"] == {"k": 2, "n": 4, "value": 0.5, "ci95": current["shown"]["ci95"]}
    assert set(o.per_query()["ood"]) == {"bluffs", "ood_related"}
    assert o.per_query()["in_domain"]["kept_fixed_top_k"] == o.fixed_needle


def test_an_answer_is_written_from_its_top_ranks_within_the_related_threshold() -> None:
    in_domain = [
        _cands((1, 0.30), (2, 0.50), (3, 0.55)),  # needle 2 in the top 2, related, not passing
        _cands((4, 0.30), (5, 0.31), (6, 0.50)),  # needle 6 ranked below the top 2
        _cands((7, 0.30), (8, 0.65)),  # needle 8 beyond the related threshold
    ]
    ood = [_cands((1, 0.50), (2, 0.35)), _cands((3, 0.45), (4, 0.55))]
    replay = Replay(in_domain, ood, [{2}, {6}, {8}], {}, top_k=2, max_kept=2, margin=0.0)
    o = replay.outcomes(0.4, 0.6)
    assert o.answered == [True, True, True] and o.kept_needle == [True, False, False]
    assert o.kept_passages == [2, 2, 1]
    assert o.shown == [True, False, False]
    # Every related passage among an answer's first top_k is given to the model.
    assert o.shown_beside == [False, False, False] and o.beside_passages == [0, 0, 0]
    # The decision is the best distance's alone: 0.35 passes, 0.45 is only related.
    assert o.bluffs == [True, False] and o.ood_related == [False, True]
    # With the related threshold at the answer threshold only passing passages are given.
    off = replay.outcomes(0.4, 0.4)
    assert off.answered == o.answered and off.kept_needle == [False, False, False]
    assert off.kept_passages == [1, 2, 1] and off.bluffs == o.bluffs


def test_an_answer_takes_its_passages_in_the_order_it_keeps_them_in() -> None:
    fused = _cands((1, 0.30), (2, 0.50), (3, 0.55))
    kept_order = [fused[0], fused[2], fused[1]]  # its best sentences put 3 before 2
    ordered = Replay(
        [fused], [], [{3}], {}, top_k=2, max_kept=2, margin=0.0, kept_order=[kept_order]
    )
    plain = Replay([fused], [], [{3}], {}, top_k=2, max_kept=2, margin=0.0)
    assert ordered.outcomes(0.4, 0.6).kept_needle == [True]
    assert plain.outcomes(0.4, 0.6).kept_needle == [False]


def test_related_sweep_and_the_proposal_rule() -> None:
    replay = _replay()
    rows = related_sweep(replay, 0.4, [0.3, 0.4, 0.5, 0.6, 0.75, 0.85])
    assert [r.related_threshold for r in rows] == [0.4, 0.5, 0.6, 0.75, 0.85]
    assert [r.hard_refused.successes for r in rows] == [3, 1, 1, 1, 0]
    assert [r.ood_shown.successes for r in rows] == [1, 2, 2, 2, 3]
    # Smallest with at most a quarter refused outright, within the out-of-domain cap.
    chosen = propose_related(rows, max_hard_refused=0.25, max_ood_shown=0.7)
    assert chosen is not None and chosen.related_threshold == 0.5
    # Nothing refuses that little within the cap: the largest within it.
    capped = propose_related(rows, max_hard_refused=0.0, max_ood_shown=0.7)
    assert capped is not None and capped.related_threshold == 0.75


def test_write_env_sets_both_thresholds(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("KB_RELATED_THRESHOLD=0.9\nA=1\nKB_THRESHOLD=0.3\n")
    write_env(env, 0.45, 0.575)
    assert env.read_text() == "KB_RELATED_THRESHOLD=0.575\nA=1\nKB_THRESHOLD=0.45\n"
    fresh = tmp_path / "fresh.env"
    write_env(fresh, 0.45, 0.6)
    assert fresh.read_text() == "KB_THRESHOLD=0.45\nKB_RELATED_THRESHOLD=0.6\n"


# ---------------------------------------------------------------------- kb eval on evalmini


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("outcomes")
    env = {"KB_THRESHOLD": str(THRESHOLD), "KB_RELATED_THRESHOLD": str(RELATED)}
    args = ["--data-dir", str(out / "kb"), "eval", *EVALSET_OPTIONS, "--no-progress"]
    result = CliRunner().invoke(main, [*args, "--json", "--report", str(out / "eval.md")], env=env)
    assert result.exit_code == 0, result.output
    return {"data": json.loads(result.stdout), "report": (out / "eval.md").read_text()}


def test_eval_counts_every_outcome_at_the_configured_thresholds(run: dict[str, Any]) -> None:
    gate = run["data"]["gate"]
    assert (gate["threshold"], gate["related_threshold"]) == (THRESHOLD, RELATED)
    best = gate["distances"]["in_domain_best"]
    ood_best = gate["distances"]["ood_best"]
    cur = gate["current"]
    n = run["data"]["queries"]
    assert cur["answered"]["k"] == sum(d <= THRESHOLD for d in best)
    assert cur["related"]["k"] == sum(THRESHOLD < d <= RELATED for d in best)
    assert cur["hard_refused"]["k"] == sum(d > RELATED for d in best)
    assert cur["answered"]["k"] + cur["related"]["k"] + cur["hard_refused"]["k"] == n
    assert cur["related"]["k"] > 0 and cur["answered"]["k"] > 0  # the thresholds split the set
    assert cur["ood_related"]["k"] == sum(THRESHOLD < d <= RELATED for d in ood_best)
    assert cur["bluffs"]["k"] == sum(d <= THRESHOLD for d in ood_best)
    # Shown: an answer's kept needle, one beside it, or a rescue; each query one way at most.
    per = gate["per_query"]["in_domain"]
    assert cur["shown"]["k"] == cur["answerable"]["k"] + cur["beside"]["k"] + cur["rescued"]["k"]
    for i in range(n):
        assert per["rescued"][i] <= per["related"][i] and per["rescued"][i] <= per["shown"][i]
        assert per["beside"][i] <= per["answered"][i] and per["beside"][i] <= per["shown"][i]
    assert len(gate["per_query"]["ood"]["ood_related"]) == run["data"]["ood_questions"]


def test_related_sweep_covers_the_looser_threshold(run: dict[str, Any]) -> None:
    rows = run["data"]["gate"]["related_sweep"]
    assert rows[0]["related_threshold"] == THRESHOLD and rows[0]["related"]["k"] == 0
    assert all(r["related_threshold"] >= THRESHOLD for r in rows)
    hard = [r["hard_refused"]["k"] for r in rows]
    assert hard == sorted(hard, reverse=True) and hard[-1] == 0
    ood_shown = [r["ood_shown"]["k"] for r in rows]
    assert ood_shown == sorted(ood_shown)
    (at,) = [r for r in rows if r["related_threshold"] == RELATED]
    assert at["rescued"] == run["data"]["gate"]["current"]["rescued"]
    report = run["report"]
    assert f"### What the asker gets (answer threshold {THRESHOLD:.3f}" in report
    assert "### Related threshold sweep" in report


def test_calibrate_proposes_and_writes_both_thresholds(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    args = ["--data-dir", str(tmp_path / "kb"), "calibrate", *EVALSET_OPTIONS, "--no-progress"]
    result = CliRunner().invoke(
        main, [*args, "--max-bluff-rate", "0", "--write-env", str(env), "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    threshold, related = data["proposed_threshold"], data["proposed_related_threshold"]
    assert related is not None and related >= threshold
    rows = data["related_sweep"]
    assert rows and all(r["related_threshold"] >= threshold for r in rows)
    (chosen,) = [r for r in rows if r["related_threshold"] == related]
    assert chosen["hard_refused"]["value"] <= 0.05 and chosen["ood_shown"]["value"] <= 0.5
    # The smallest that qualifies: every smaller one refuses more than 5 % outright.
    assert all(r["hard_refused"]["value"] > 0.05 for r in rows if r["related_threshold"] < related)
    assert env.read_text().splitlines() == [
        f"KB_THRESHOLD={threshold:g}",
        f"KB_RELATED_THRESHOLD={related:g}",
        # The model they were measured with: with another one they are not used.
        'KB_THRESHOLD_MODEL="sentence-transformers/all-MiniLM-L6-v2"',
    ]
    written = Settings(_env_file=str(env))  # type: ignore[call-arg]
    assert (
        written.thresholds().answer == threshold and written.thresholds().origin == "KB_THRESHOLD"
    )
    switched = Settings(_env_file=str(env), KB_EMBEDDING_MODEL="multilingual")  # type: ignore[call-arg]
    assert switched.thresholds().answer != threshold and "not used" in switched.thresholds().origin


def test_eval_says_whether_a_query_map_ordered_the_candidates(run: dict[str, Any]) -> None:
    # evalmini's corpus has sentences enough for a query map: one is fitted and used.
    status = run["data"]["query_map"]
    assert isinstance(status, dict), status
    assert set(status) == {"embedding_model", "chunks", "sentences", "fitted_at"}
    assert status["embedding_model"] == run["data"]["embedding_model"]
    assert status["sentences"] >= MIN_ANCHORS
    shown = f"fitted on {status['sentences']} sentences"
    assert f"query map (`KB_QUERY_ADAPTER`): {shown}" in run["report"]
